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

import json
import math
import re
import struct
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError as DecodeProtoError

from trainsentry.point import RunEnd, no_collection
from trainsentry.sources.base import Decoded, DecodeError, Shapes
from trainsentry.sources.run_trace import TraceMemory, flatten
from trainsentry.sources.wandb_history import HistoryBytes, Plans, row_of

BLOCK = 32768
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
HEADER_LEN = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_FRAME = struct.Struct("<IHB")
_TYPE_CRC = [zlib.crc32(bytes([t])) for t in range(256)]


# The part of `wandb_internal.Record` read here: per message, its fields as
# `name=number:type` (W&B's numbers, wandb/proto/wandb_internal.proto), `*` for a
# repeated field, `|` for the fields of the message's one oneof.
_MESSAGES = {
    "HistoryStep": "num=1:int64",
    "HistoryItem": "key=1:string nested_key=2:*string integer=5:|sint64 number=6:|double "
    "value_json=16:string",
    "HistoryRecord": "item=1:*HistoryItem step=2:HistoryStep",
    "ConfigItem": "key=1:string nested_key=2:*string value_json=16:string",
    "ConfigRecord": "update=1:*ConfigItem",
    "GitRepoRecord": "remote_url=1:string commit=2:string",
    "RunRecord": "run_id=1:string project=3:string config=4:ConfigRecord "
    "display_name=8:string host=13:string git=21:GitRepoRecord",
    "RunExitRecord": "exit_code=1:int32",
    "RunPreemptingRecord": "",
    "Record": "history=2:|HistoryRecord config=5:|ConfigRecord run=17:|RunRecord "
    "exit=18:|RunExitRecord preempting=23:|RunPreemptingRecord",
}
_ONEOF = {"HistoryItem": "value", "Record": "record_type"}

# A record's `num` (field 1, a varint) as W&B writes it, first, and the tag of its kind's
# field after it: a record of a kind read nowhere here (`record_type` fields 3, 4, 6-13:
# summary, output, files, stats, artifact, tbrecord, alert, telemetry, metric,
# output_raw) is passed over unparsed (two thirds of a run file are summary records,
# one after each history row); a history record (field 2) is read from its bytes.
_UNREAD = re.compile(rb"\x08[\x80-\xff]{0,9}[\x00-\x7f][\x1a\x22\x32\x3a\x42\x4a\x52\x5a\x62\x6a]")
_HISTORY = re.compile(rb"\x08[\x80-\xff]{0,9}[\x00-\x7f]\x12")


def _record_class() -> Any:
    """`_MESSAGES` as a protobuf class built at import.

    Built from a descriptor, not from wandb's generated module: the field numbers
    and types are W&B's, the parsing protobuf's own C code, and every field not
    declared here is skipped as unknown.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    package = "trainsentry_wandb"
    proto = descriptor_pb2.FileDescriptorProto(
        name="trainsentry/wandb_record.proto", package=package, syntax="proto3"
    )
    for name, spec in _MESSAGES.items():
        msg = proto.message_type.add(name=name)
        if name in _ONEOF:
            msg.oneof_decl.add(name=_ONEOF[name])
        for declared in spec.split():
            field_name, rest = declared.split("=")
            number, kind = rest.split(":")
            field = msg.field.add(name=field_name, number=int(number))
            field.label = f.LABEL_REPEATED if kind.startswith("*") else f.LABEL_OPTIONAL
            if kind.startswith("|"):
                field.oneof_index = 0
            kind = kind.lstrip("*|")
            if kind in _MESSAGES:
                field.type, field.type_name = f.TYPE_MESSAGE, f".{package}.{kind}"
            else:
                field.type = getattr(f, f"TYPE_{kind.upper()}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.Record"))


Record = _record_class()


def _json_number(raw: str) -> float | None:
    """A value_json that is a number: float() reads JSON's numbers and the NaN and
    Infinity that W&B writes for non-finite values; strings, bools, objects are None."""
    try:
        return float(raw)
    except ValueError:
        return None


def _config_items(items: Any) -> list[tuple[str, str]]:
    """A config record's items as trace entries: W&B's own `_wandb` keys left out, a
    nested value's keys joined with `/` as history keys are, a string without its quotes."""
    out: list[tuple[str, str]] = []
    for item in items:
        key = item.key or "/".join(item.nested_key)
        if key.startswith("_"):
            continue
        try:
            value = json.loads(item.value_json) if item.value_json else None
        except ValueError:
            value = item.value_json
        flatten(key, value, out)
    return out


HEAD_BYTES = 2 * BLOCK  # where a run file's run record is: its second record


def run_name(path: Path) -> str | None:
    """`<project>/<display name>-<run id>` from the run record at the file's head, the
    name a user gave `wandb.init(name=...)`; "" when the file cannot tell (not a W&B
    run file, a damaged head); None while the record is yet to be written.

    wandb-core writes the file in 32 KiB blocks: a live run's file holds its header
    alone until its first block is full (or the run ends), and the run record is in
    that block, so waiting for the name costs no point."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError:
        return ""
    decoded = WandbDecoder().feed(head, at_eof=False, file_time=math.nan)
    about = decoded.trace.get("run")
    if about is None:
        waiting = head[:HEADER_LEN] == HEADER and len(head) < BLOCK and not decoded.errors
        return None if waiting or len(head) < HEADER_LEN else ""
    run_id = about.get("id", "").replace("/", "_")
    name = (about.get("name") or run_id).replace("/", "_")
    project = (about.get("project") or "project").replace("/", "_")
    return f"{project}/{name}-{run_id}" if run_id else ""


class WandbDecoder:
    """Bytes of a `.wandb` file → one Row per history record with numbers."""

    def __init__(self) -> None:
        self._pos = 0  # the file offset of the next byte fed: blocks are aligned to it
        self._refused = False
        self._plans = Plans(Shapes())
        self._history = HistoryBytes(self._plans)
        self._memory = TraceMemory()  # what the run, config and exit records said

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        with no_collection():  # rows by the hundred thousand on a backfill (point.py)
            return self._feed(data, at_eof, file_time)

    def _feed(self, data: bytes | memoryview, at_eof: bool, file_time: float) -> Decoded:
        raw = data if isinstance(data, bytes) else bytes(data)
        out = Decoded(consumed=0)
        self._memory.resend(out)
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
        start = self._pos
        unpack, crc32, type_crc, record = _FRAME.unpack_from, zlib.crc32, _TYPE_CRC, self._record
        unread = _UNREAD.match
        while True:
            left = BLOCK - (start + i) % BLOCK
            if left < HEADER_LEN:  # block trailer: zero padding
                if n - i < left:
                    break
                i += left
                if not parts:
                    committed = i
                continue
            if n - i < HEADER_LEN:
                break
            crc, length, kind = unpack(raw, i)
            end = i + HEADER_LEN + length
            if length > left - HEADER_LEN or not FULL <= kind <= LAST:
                i = self._skip_block(out, committed, i, left, n, "a damaged record frame")
                parts.clear()
                if i < 0:
                    break
                committed = i
                continue
            if end > n:
                break
            body = raw[i + HEADER_LEN : end]
            if crc32(body, type_crc[kind]) != crc:
                i = self._skip_block(out, committed, i, left, n, "a record with a bad checksum")
                parts.clear()
                if i < 0:
                    break
                committed = i
                continue
            i = end
            if kind == FULL:  # most records: one frame, a record of its own
                if parts:
                    parts = []
                if not unread(body):
                    record(out, body, committed, file_time)
                committed = i
                continue
            if kind == FIRST:
                parts = [body]
                continue
            if not parts:  # the rest of a record lost with a damaged block: dropped
                committed = i
                continue
            parts.append(body)
            if kind == MIDDLE:
                continue
            whole = b"".join(parts)
            if not unread(whole):
                record(out, whole, committed, file_time)
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
        history = _HISTORY.match(record)
        if history is not None:
            read = self._history.items(record, history.end())
            if read is not None:
                row = row_of(*read, file_time)
                if row is not None:
                    out.rows.append(row)
                return
        parsed = Record()
        try:
            parsed.ParseFromString(record)
        except DecodeProtoError:
            out.errors.append(DecodeError(offset, "a W&B record that is no protobuf: skipped"))
            return
        which = parsed.WhichOneof("record_type")
        if which != "history":
            if which is not None:
                self._tell(out, parsed, which, file_time)
            return
        history = parsed.history
        keys: list[str] = []
        values: list[float] = []
        for item in history.item:
            which = item.WhichOneof("value")
            if which == "number":
                value: float | None = item.number
            elif which == "integer":
                value = float(item.integer)
            elif item.value_json:
                value = _json_number(item.value_json)
            else:
                continue
            if value is not None:
                keys.append(item.key or "/".join(item.nested_key))
                values.append(value)
        step = history.step.num if history.HasField("step") else None
        row = row_of(self._plans(tuple(keys)), values, step, file_time)
        if row is not None:
            out.rows.append(row)

    def _tell(self, out: Decoded, record: Any, which: str, file_time: float) -> None:
        """What a record other than history says of the run: its trace, its end."""
        if which == "run":
            run = record.run
            about = {"project": run.project, "name": run.display_name, "id": run.run_id,
                     "host": run.host, "git commit": run.git.commit,
                     "git remote": run.git.remote_url}  # fmt: skip
            self._memory.add(out, "run", [(k, v) for k, v in about.items() if v])
            self._memory.add(out, "config", _config_items(run.config.update))
        elif which == "config":
            self._memory.add(out, "config", _config_items(record.config.update))
        elif which == "exit":
            code = record.exit.exit_code
            end = RunEnd("finished") if code == 0 else RunEnd("crashed", f"W&B exit code {code}")
            self._memory.end(out, replace(end, wall=file_time))
        elif which == "preempting":
            self._memory.end(out, RunEnd("preempted", "W&B run marked preempting", file_time))

    def snapshot(self) -> dict[str, Any]:
        return self._memory.snapshot({"pos": self._pos, "refused": self._refused})

    def restore(self, state: dict[str, Any]) -> None:
        """Resumed mid-file, after the run and config records: what they said is said
        again with the first read (TraceMemory)."""
        self._pos = int(state.get("pos", 0))
        self._refused = bool(state.get("refused", False))
        self._memory.restore(state)

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A rewritten .wandb file is a new run's: read it from the start."""
