"""A W&B history record read from its bytes, and what a history row's keys mean.

Most of a `.wandb` file is history rows, one per `wandb.log` call, and a run's
rows repeat the same few keys with only the numbers changing. So a record is
read here without protobuf objects: one regex pass over its items, each item's
framing (item length, key, value length) looked up in a cache of the framings
already seen, and the value's JSON text handed to `float`. Building protobuf
messages and reading their fields from Python cost 3× W&B's own parse loop.

Only the shape W&B writes (`wandb_records.py` has the field numbers) is read
here: the record's `num`, then its history and nothing after it; items of one
`key` or one `nested_key` and a `value_json` that is a JSON number (or W&B's
`NaN`, `Infinity`, `-Infinity`); then the optional step. Every length on the
way is checked against what the regex found, so the items read are exactly
the ones protobuf would read. Anything else (a string or media value, typed
`number`/`integer` values of other writers, a multi-part nested key, fields
after the history) returns None, and the caller parses the record with
protobuf as before: the same row, only slower.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any, NamedTuple

from orjson import JSONDecodeError as _OrjsonError
from orjson import loads as _orjson_loads

from trainsentry.point import Row
from trainsentry.sources.base import Shapes

_new = tuple.__new__

# One item: `\n` ilen, then `key` (tag 0x0a) or `nested_key` (0x12) with its length and
# bytes, then `value_json` (field 16: 0x82 0x01) with its length: the "framing", whose
# bytes fix every length in it; then the value, of the characters JSON numbers and W&B's
# non-finite words are written with (none of which is a framing byte that follows it).
# Lengths of one byte only (under 128): a longer key or value is read by protobuf.
# Matched in the record's bytes decoded as Latin-1 (one character a byte): `float` of a
# str is 5× faster than of bytes.
_ITEM = re.compile(
    "(\n[\x00-\x7f][\n\x12][\x00-\x7f][^\x82]*\x82\x01[\x00-\x7f])([-+.0-9eEINafinty]+)",
    re.S,
)
# What is remembered per followed run file, bounded so that a daemon following hundreds
# of runs holds little for each: item framings (keys × value lengths; ~150 bytes each),
# and sequences of them (key orders × value lengths; ~300 bytes each, the framings shared
# with the first). Past a bound it starts over; a record not remembered is read item by
# item (~2 µs more), never differently.
FRAMINGS = 4096
RECORDS = 1024


class Plan(NamedTuple):
    """What a row's keys, in their order, make of its values."""

    tags: tuple[str, ...]  # the series, safe names (base.Shapes)
    pick: Callable[[list[float]], Any] | None  # their values, out of all the item values
    one: bool  # a single series: `pick` gives its value, not a tuple
    steps: tuple[int, ...]  # where `_step` items are: the step when the record has none
    stamp: int  # where the last `_timestamp` item is (-1: none): the row's wall time


class Plans:
    """One Plan per key sequence, shared by the rows of that sequence: the meaning of
    W&B's own keys (`_step`, `_timestamp`, others with `_`) said in one place."""

    LIMIT = 4096

    def __init__(self, shapes: Shapes) -> None:
        self._shapes = shapes
        self._seen: dict[tuple[str, ...], Plan] = {}

    def __call__(self, keys: tuple[str, ...]) -> Plan:
        plan = self._seen.get(keys)
        if plan is None:
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            at = [i for i, key in enumerate(keys) if not key.startswith("_")]
            stamps = [i for i, key in enumerate(keys) if key == "_timestamp"]
            plan = self._seen[keys] = Plan(
                self._shapes(tuple(keys[i] for i in at)),
                itemgetter(*at) if at else None,
                len(at) == 1,
                tuple(i for i, key in enumerate(keys) if key == "_step"),
                stamps[-1] if stamps else -1,
            )
        return plan


def row_of(plan: Plan, values: list[float], step: int | None, file_time: float) -> Row | None:
    """The row of a history record's items with numbers, their keys' plan given (None: no
    series in it). `step`: the record's step field (None when absent), else the first
    finite `_step` item's value."""
    if plan.pick is None:
        return None
    if step is None:
        for i in plan.steps:
            if math.isfinite(values[i]):
                step = int(values[i])
                break
    wall = values[plan.stamp] if plan.stamp >= 0 else file_time
    picked = plan.pick(values)
    return _new(Row, (step or 0, wall, plan.tags, (picked,) if plan.one else picked))


class Framed(NamedTuple):
    """What a sequence of item framings says, once checked: the plan of the items' keys
    and their values' lengths."""

    plan: Plan
    lengths: list[int]


class HistoryBytes:
    """History records read from their bytes; the framings seen kept for the next."""

    def __init__(self, plans: Plans) -> None:
        self._plans = plans
        # an item's framing (its bytes as Latin-1) -> its key, its value's length, and
        # the framing kept (the one a remembered sequence holds, not each record's copy)
        self._items: dict[str, tuple[str, int, str]] = {}
        # a record's framings, in order -> their keys and lengths: a run's rows repeat a
        # few key orders and value lengths, so most records are one lookup
        self._records: dict[tuple[str, ...], Framed] = {}

    def items(self, record: bytes, at: int) -> tuple[Plan, list[float], int | None] | None:
        """The plan of a history record's keys, its values and its step field (None: absent), or
        None when the record is not of the shape read here. `at`: where the length of the
        record's history field is, after its `num` and the field's tag."""
        n = len(record)
        size, i = _varint(record, at)
        if size < 0 or i + size != n:  # the history field, and nothing after it
            return None
        # [before, framing, value, between, framing, value, ..., after]: the items are
        # the history's own, back to back from its start, when nothing is between them
        parts = _ITEM.split(record[i:].decode("latin-1"))
        if len(parts) < 4 or any(parts[0:-1:3]):
            return None
        framings = tuple(parts[1::3])
        raw = parts[2::3]
        framed = self._records.get(framings) or self._frame(framings)
        if framed is None or list(map(len, raw)) != framed.lengths:
            return None
        values = _numbers(raw)
        if values is None:
            return None
        after = parts[-1]
        if not after:
            return framed.plan, values, None
        step = _step(after)
        return None if step is None else (framed.plan, values, step)

    def _frame(self, framings: tuple[str, ...]) -> Framed | None:
        """The keys and lengths of a sequence of framings, once each agrees with itself."""
        known = []
        for framing in framings:
            item = self._items.get(framing) or self._learn(framing)
            if item is None:
                return None
            known.append(item)
        if len(self._records) >= RECORDS:
            self._records.clear()
        framed = self._records[tuple(kept for _, _, kept in known)] = Framed(
            self._plans(tuple(key for key, _, _ in known)), [length for _, length, _ in known]
        )
        return framed

    def _learn(self, framing: str) -> tuple[str, int, str] | None:
        """An item framing's key and value length, if its lengths agree with each other
        (`\\n` ilen, key tag, klen, key, 0x82 0x01, vlen) and its key is UTF-8."""
        ilen, klen, vlen = ord(framing[1]), ord(framing[3]), ord(framing[-1])
        if klen != len(framing) - 7 or ilen != len(framing) - 2 + vlen:
            return None
        try:
            key = framing[4:-3].encode("latin-1").decode()
        except UnicodeDecodeError:
            return None
        if len(self._items) >= FRAMINGS:
            self._items.clear()
        item = self._items[framing] = (key, vlen, framing)
        return item


def _numbers(raw: list[str]) -> list[float] | None:
    """The value texts as floats, exactly as `float` reads each (None: one is no number).

    orjson reads the JSON numbers of a row in one call, 5× faster than `float` one by
    one; what it refuses (W&B's `NaN` and `Infinity`, text JSON has no number for) is
    read by `float`. An integer comes back an int, made a float as `float` makes it,
    but for `-0`, whose sign only `float` keeps."""
    if "-0" not in raw:
        try:
            return list(map(float, _orjson_loads("[" + ",".join(raw) + "]")))
        except (_OrjsonError, OverflowError):
            pass
    try:
        return list(map(float, raw))
    except ValueError:
        return None


def _step(field: str) -> int | None:
    """The num of a history's step field, its bytes as Latin-1 (0 when empty; int64, read
    as protobuf reads it), or None when the field is not only that."""
    if field == "\x12\x00":
        return 0
    if len(field) < 4 or field[0] != "\x12" or field[2] != "\x08":
        return None
    if ord(field[1]) != len(field) - 2 or not _VARINT_TEXT.fullmatch(field, 3):
        return None
    step = 0
    for byte in reversed(field[3:]):
        step = (step << 7) | (ord(byte) & 0x7F)
    step &= (1 << 64) - 1  # int64 on the wire: two's complement
    return step - (1 << 64) if step >= 1 << 63 else step


_VARINT_TEXT = re.compile("[\x80-\xff]{0,9}[\x00-\x7f]")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """A protobuf varint at `i` and where it ends; (-1, i) when it runs past the end."""
    n = len(data)
    if i + 1 < n and data[i + 1] < 0x80:  # most lengths: one or two bytes
        return (data[i], i + 1) if data[i] < 0x80 else ((data[i] & 0x7F) | data[i + 1] << 7, i + 2)
    value, shift = 0, 0
    while i < n and shift < 70:
        byte = data[i]
        value |= (byte & 0x7F) << shift
        i += 1
        if not byte & 0x80:
            return value, i
        shift += 7
    return -1, i
