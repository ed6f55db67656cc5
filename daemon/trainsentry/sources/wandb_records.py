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
hundreds of files should carry. Only the few fields needed are read, by a
small protobuf wire-format walk: unknown fields are skipped as protobuf itself
does, so a newer writer's additions do not break reading. The tests check this
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

import orjson

from trainsentry.point import Row
from trainsentry.sources.base import Decoded, DecodeError, Shapes

BLOCK = 32768
HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
HEADER_LEN = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
_FRAME = struct.Struct("<IHB")
_DOUBLE = struct.Struct("<d")
_TYPE_CRC = [zlib.crc32(bytes([t])) for t in range(256)]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 70:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message: bytes for length-delimited fields."""
    out: list[tuple[int, int, Any]] = []
    i, n = 0, len(buf)
    while i < n:
        key, i = _varint(buf, i)
        number, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 1:
            value, i = buf[i : i + 8], i + 8
        elif wire == 2:
            size, i = _varint(buf, i)
            value, i = buf[i : i + size], i + size
        elif wire == 5:
            value, i = buf[i : i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        if i > n:
            raise ValueError("field runs past its message")
        out.append((number, wire, value))
    return out


def _item(buf: bytes) -> tuple[str, float | None]:
    """A HistoryItem's key (nested keys joined by '/') and its number, if it is one."""
    key, nested, value = "", [], None
    for number, wire, raw in _fields(buf):
        if number == 1 and wire == 2:
            key = raw.decode("utf-8", "replace")
        elif number == 2 and wire == 2:
            nested.append(raw.decode("utf-8", "replace"))
        elif number == 5 and wire == 0:  # sint64, zigzag
            value = float((raw >> 1) ^ -(raw & 1))
        elif number == 6 and wire == 1:
            value = _DOUBLE.unpack(raw)[0]
        elif number == 16 and wire == 2:
            value = _json_number(raw)
    return "/".join(nested) if nested else key, value


def _json_number(raw: bytes) -> float | None:
    try:
        got = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw.strip().strip(b'"')  # NaN / Infinity as wandb writes them
        return {b"NaN": math.nan, b"Infinity": math.inf, b"-Infinity": -math.inf}.get(text)
    if isinstance(got, bool) or not isinstance(got, int | float):
        return None
    return float(got)


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
        try:
            history = [v for number, wire, v in _fields(record) if number == 2 and wire == 2]
            if not history:
                return
            step: int | None = None
            wall = file_time
            tags: list[str] = []
            values: list[float] = []
            for number, wire, value in _fields(history[0]):
                if number == 2 and wire == 2:
                    for num, w, v in _fields(value):
                        if num == 1 and w == 0:
                            step = v - (1 << 64) if v >= 1 << 63 else v
                elif number == 1 and wire == 2:
                    key, got = _item(value)
                    if got is None:
                        continue
                    if key == "_step":
                        step = int(got) if step is None and math.isfinite(got) else step
                    elif key == "_timestamp":
                        wall = got
                    elif not key.startswith("_"):
                        tags.append(key)
                        values.append(got)
        except (ValueError, IndexError, struct.error):
            out.errors.append(DecodeError(offset, "a W&B record that is no protobuf: skipped"))
            return
        if tags:
            out.rows.append(Row(step or 0, wall, self._shapes(tuple(tags)), tuple(values)))

    def snapshot(self) -> dict[str, Any]:
        return {"pos": self._pos, "refused": self._refused}

    def restore(self, state: dict[str, Any]) -> None:
        self._pos = int(state.get("pos", 0))
        self._refused = bool(state.get("refused", False))

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A rewritten .wandb file is a new run's: read it from the start."""
