"""Weights & Biases' local run file, `run-<id>.wandb`: the history rows of one W&B run.

The file is a LevelDB-log record stream (32 KiB blocks; each record framed by
crc32, length and type FULL/FIRST/MIDDLE/LAST; a block's last <7 bytes are
zero padding) after a 7-byte header `:W&B`, magic 0xBEE1, version 0. Each
logical record is a protobuf `wandb_internal.Record`; a history row is its
field 2, a `HistoryRecord` of items (`key`, `nested_key`, and the value as
`value_json` or, in newer writers, as typed `integer`/`number`) and the step.

Decoded here rather than through wandb itself: wandb 0.31 ships no Python
reader of this file (its datastore moved into the Go `wandb-core`), and
importing the wandb package costs a second and a thread pool, pulls in its
settings machinery and is network-minded, none of which a daemon that tails
hundreds of files should carry. Only the few fields needed are declared, in a
protobuf class built here from W&B's field numbers (`Record`): protobuf (a
dependency already, for TensorBoard) parses them in C and skips every other
field as unknown, so a newer writer's additions do not break reading. The tests check this
decoder against files written by the real `wandb` package in offline mode.

A damaged record (bad checksum, impossible length) costs the rest of its block,
as LevelDB's own reader does, with one error; a file of another header version
is said once and not read.
"""

from __future__ import annotations

import math
import struct
import zlib
from typing import Any

from google.protobuf.message import DecodeError as DecodeProtoError

from trainsentry.point import Row
from trainsentry.sources.base import Decoded, DecodeError, Shapes

BLOCK = 32768
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
HEADER_LEN = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_FRAME = struct.Struct("<IHB")
_TYPE_CRC = [zlib.crc32(bytes([t])) for t in range(256)]


def _record_class() -> Any:
    """The part of `wandb_internal.Record` read here, as a protobuf class built at import.

    Built from a descriptor, not from wandb's generated module: the field numbers
    and types are W&B's (wandb/proto/wandb_internal.proto), the parsing protobuf's
    own C code, and every field not declared here is skipped as unknown.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="trainsentry/wandb_record.proto", package="trainsentry_wandb", syntax="proto3"
    )

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> Any:
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, label, type_name in fields:
            field = msg.field.add(name=field_name, number=number, type=kind, label=label)
            if type_name:
                field.type_name = type_name
        return msg

    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    message("HistoryStep", ("num", 1, f.TYPE_INT64, one, ""))
    item = message(
        "HistoryItem",
        ("key", 1, f.TYPE_STRING, one, ""),
        ("nested_key", 2, f.TYPE_STRING, many, ""),
        ("integer", 5, f.TYPE_SINT64, one, ""),
        ("number", 6, f.TYPE_DOUBLE, one, ""),
        ("value_json", 16, f.TYPE_STRING, one, ""),
    )
    item.oneof_decl.add(name="value")
    item.field[2].oneof_index = item.field[3].oneof_index = 0
    message(
        "HistoryRecord",
        ("item", 1, f.TYPE_MESSAGE, many, ".trainsentry_wandb.HistoryItem"),
        ("step", 2, f.TYPE_MESSAGE, one, ".trainsentry_wandb.HistoryStep"),
    )
    message("Record", ("history", 2, f.TYPE_MESSAGE, one, ".trainsentry_wandb.HistoryRecord"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("trainsentry_wandb.Record"))


Record = _record_class()


def _json_number(raw: str) -> float | None:
    """A value_json that is a number: float() reads JSON's numbers and the NaN and
    Infinity that W&B writes for non-finite values; strings, bools, objects are None."""
    try:
        return float(raw)
    except ValueError:
        return None


class WandbDecoder:
    """Bytes of a `.wandb` file → one Row per history record with numbers."""

    def __init__(self) -> None:
        self._pos = 0  # the file offset of the next byte fed: blocks are aligned to it
        self._refused = False
        self._shapes = Shapes()

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        raw = data if isinstance(data, bytes) else bytes(data)
        out = Decoded(consumed=0)
        if self._refused:
            out.consumed = len(raw)
            self._pos += len(raw)
            return out
        i = 0
        if self._pos == 0:
            if len(raw) < HEADER_LEN:
                return out
            if raw[:HEADER_LEN] != HEADER:
                self._refused = True
                why = (
                    f"a .wandb file of header version {raw[6]} (this trainsentry reads 0): not read"
                    if raw[:4] == HEADER[:4]
                    else "not a W&B run file (no :W&B header): not read"
                )
                out.errors.append(DecodeError(0, why))
                out.consumed, self._pos = len(raw), len(raw)
                return out
            i = HEADER_LEN
        committed = i  # the end of the last complete logical record
        parts: list[bytes] = []
        n = len(raw)
        while True:
            pos = self._pos + i
            left = BLOCK - pos % BLOCK
            if left < HEADER_LEN:  # block trailer: zero padding
                if n - i < left:
                    break
                i += left
                if not parts:
                    committed = i
                continue
            if n - i < HEADER_LEN:
                break
            crc, length, kind = _FRAME.unpack_from(raw, i)
            end = i + HEADER_LEN + length
            if length > left - HEADER_LEN or kind not in (FULL, FIRST, MIDDLE, LAST):
                i = self._skip_block(out, committed, i, left, n, "a damaged record frame")
                parts.clear()
                if i < 0:
                    break
                committed = i
                continue
            if end > n:
                break
            body = raw[i + HEADER_LEN : end]
            if zlib.crc32(body, _TYPE_CRC[kind]) != crc:
                i = self._skip_block(out, committed, i, left, n, "a record with a bad checksum")
                parts.clear()
                if i < 0:
                    break
                committed = i
                continue
            i = end
            if kind == FULL:
                parts = [body]
            elif kind == FIRST:
                parts = [body]
                continue
            elif not parts:  # the rest of a record lost with a damaged block: dropped
                committed = i
                continue
            elif kind == MIDDLE:
                parts.append(body)
                continue
            else:
                parts.append(body)
            self._record(out, b"".join(parts), committed, file_time)
            parts = []
            committed = i
        out.consumed = committed
        self._pos += committed
        return out

    def _skip_block(
        self, out: Decoded, committed: int, i: int, left: int, n: int, what: str
    ) -> int:
        """Where reading goes on after a damaged record: the next block, or -1 while that
        block's end is not written yet (a torn write looks damaged until it is finished)."""
        if n - i < left:
            return -1
        out.errors.append(DecodeError(committed, f"{what}: skipped to the next 32 KiB block"))
        return i + left

    def _record(self, out: Decoded, record: bytes, offset: int, file_time: float) -> None:
        parsed = Record()
        try:
            parsed.ParseFromString(record)
        except DecodeProtoError:
            out.errors.append(DecodeError(offset, "a W&B record that is no protobuf: skipped"))
            return
        if not parsed.HasField("history"):
            return
        history = parsed.history
        step: int | None = history.step.num if history.HasField("step") else None
        wall = file_time
        tags: list[str] = []
        values: list[float] = []
        for item in history.item:
            key = item.key or "/".join(item.nested_key)
            which = item.WhichOneof("value")
            if which == "number":
                value: float | None = item.number
            elif which == "integer":
                value = float(item.integer)
            elif item.value_json:
                value = _json_number(item.value_json)
            else:
                continue
            if value is None:
                continue
            if key == "_step":
                step = int(value) if step is None and math.isfinite(value) else step
            elif key == "_timestamp":
                wall = value
            elif not key.startswith("_"):
                tags.append(key)
                values.append(value)
        if tags:
            out.rows.append(Row(step or 0, wall, self._shapes(tuple(tags)), tuple(values)))

    def snapshot(self) -> dict[str, Any]:
        return {"pos": self._pos, "refused": self._refused}

    def restore(self, state: dict[str, Any]) -> None:
        self._pos = int(state.get("pos", 0))
        self._refused = bool(state.get("refused", False))

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A rewritten .wandb file is a new run's: read it from the start."""
