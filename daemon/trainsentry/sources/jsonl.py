"""JSON Lines metric logs: one object per line, as written by hand-rolled loggers,
mmengine, the HF Trainer's `log_history` dumps, wandb exports and our own probe.

A line is a record only once its newline has been written: a writer flushes a
line in pieces, so a trailing line without a newline is left unconsumed even at
EOF, and is parsed once, whole, on a later read. Lines are split with
`bytes.split` and parsed by json's C scanner; everything else is a few dict
lookups per line, so a 10 MB line or a million short ones cost about what the
JSON parser costs (roughly twice, measured).

What counts as a metric (decided here, relied on by rules and the probe):

- numbers (ints and floats, including the `NaN`/`Infinity` literals Python's
  json writes) are values; bools, strings, nulls and lists are not — a list is
  ignored rather than exploded into `tag/0, tag/1, ...` because no common writer
  logs scalars that way and per-element series would be noise;
- nested objects are flattened with `/` ({"train": {"loss": 1}} → `train/loss`);
- the step is the first usable value of `step`, `global_step`, `iteration`,
  `iter`, `_step` (floats are truncated); these top-level keys never become
  series. A metric line with no usable step gets the next value of a per-file
  counter (0, 1, 2, ... over such lines only), so a file of bare
  `{"loss": ...}` lines still has an ordered step axis;
- the wall time is the first of `time`, `timestamp`, `wall_time`, `_timestamp`
  that looks like a point in time: epoch seconds (milli/micro/nanoseconds are
  scaled down) or an ISO-8601 string (naive means local time, as
  `datetime.now().isoformat()` writes). A number too small to be a date is a
  duration — mmengine logs the seconds per iteration as `time` — and becomes a
  series under its own name. Otherwise `file_time` is used;
- records marked as metadata (`"kind": "meta"`, `"type": "meta"` or a `_meta`
  key — the probe's first record) and records with no value produce nothing.
"""

from __future__ import annotations

import json
from datetime import datetime
from json.scanner import make_scanner
from typing import Any

from trainsentry.point import Sample
from trainsentry.sources.base import Decoded, DecodeError, complete_lines

STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step")
TIME_KEYS = ("time", "timestamp", "wall_time", "_timestamp")
_RESERVED = frozenset(STEP_KEYS + TIME_KEYS)

# 1e8 s is March 1973: no training log predates it, and no per-step duration
# reaches it. Above 1e11 s (year 5138) the number is in finer units.
_EARLIEST_EPOCH = 1e8
_LATEST_EPOCH = 1e11


def as_step(value: Any) -> int | None:
    """A step from a JSON value or CSV cell text; None when it is not a finite number."""
    kind = type(value)
    if kind is int:
        return int(value)
    if kind is str:
        try:
            return int(value)
        except ValueError:
            try:
                value = float(value)
            except ValueError:
                return None
            kind = float
    if kind is float and value == value and value not in (float("inf"), float("-inf")):
        return int(value)
    return None


def as_wall_time(value: Any) -> float | None:
    """Epoch seconds from a number or an ISO-8601 string; None when it is not a time."""
    kind = type(value)
    if kind is str:
        text = value.strip()
        try:
            number = float(text)
        except ValueError:
            return _parse_iso(text)
        return as_wall_time(number)
    if kind is not int and kind is not float:
        return None
    seconds = float(value)
    if not seconds >= _EARLIEST_EPOCH:  # also rejects NaN
        return None
    for _ in range(3):
        if seconds < _LATEST_EPOCH:
            return seconds
        seconds /= 1000.0
    return seconds if seconds < _LATEST_EPOCH else None


def _parse_iso(text: str) -> float | None:
    if len(text) < 10 or not text[:4].isdigit():
        return None
    if text.endswith(("Z", "z")):  # Python 3.10's fromisoformat rejects the Z suffix
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text).timestamp()
    except (ValueError, OverflowError, OSError):
        return None


def _is_meta(record: dict[str, Any]) -> bool:
    return record.get("kind") == "meta" or record.get("type") == "meta" or "_meta" in record


# The C scanner behind json.loads, called directly: loads() would re-detect the
# encoding and re-check the type of every line, a third of the cost per line.
_scan_once = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # stub is wrong
_new_sample = tuple.__new__  # Sample(...) goes through a Python-level __new__


def _parse(line: bytes) -> Any:
    """One line's JSON value; raises ValueError (or RecursionError) when it is not JSON."""
    if line[:1] != b"{":
        return json.loads(line)  # a non-object or leading whitespace: the slow, exact path
    text = line.decode("utf-8")
    try:
        value, end = _scan_once(text, 0)
    except StopIteration as exc:
        raise ValueError(f"expecting a value at char {exc.value}") from None
    if end != len(text) and not text[end:].isspace():
        raise ValueError(f"extra data at char {end}")
    return value


class JsonlDecoder:
    """Decodes JSON Lines; the only state is the counter for step-less lines."""

    def __init__(self) -> None:
        self._counter = 0

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        end, lines = complete_lines(data)
        result = Decoded(consumed=end)
        if end == 0:
            return result
        samples, errors = result.samples, result.errors
        offset = 0
        for line in lines:
            start = offset
            offset += len(line) + 1
            if not line or line.isspace():
                continue
            try:
                record = _parse(line)
            except (ValueError, RecursionError) as exc:
                errors.append(DecodeError(start, f"invalid JSON line: {exc}"))
                continue
            if type(record) is not dict:
                errors.append(DecodeError(start, f"not a JSON object: {type(record).__name__}"))
                continue
            before = len(samples)
            try:
                self._decode(record, file_time, samples)
            except OverflowError as exc:  # an integer beyond float range
                del samples[before:]
                errors.append(DecodeError(start, f"number out of range: {exc}"))
        return result

    def _decode(self, record: dict[str, Any], file_time: float, out: list[Sample]) -> None:
        if ("kind" in record or "type" in record or "_meta" in record) and _is_meta(record):
            return
        step: int | None = None
        for key in STEP_KEYS:
            if key in record:
                step = as_step(record[key])
                if step is not None:
                    break
        wall_time: float | None = None
        durations: list[tuple[str, float]] = []
        for key in TIME_KEYS:
            if key in record:
                value = record[key]
                seconds = as_wall_time(value)
                if seconds is None:
                    if type(value) is float or type(value) is int:
                        durations.append((key, float(value)))  # a duration, not a date
                elif wall_time is None:
                    wall_time = seconds
        at = self._counter if step is None else step
        when = file_time if wall_time is None else wall_time
        before = len(out)
        nested: list[tuple[str, dict[str, Any]]] = []
        for key, value in record.items():
            kind = type(value)
            if kind is float:
                if key not in _RESERVED:
                    out.append(_new_sample(Sample, (key, at, when, value)))
            elif kind is int:
                if key not in _RESERVED:
                    out.append(_new_sample(Sample, (key, at, when, float(value))))
            elif kind is dict:
                nested.append((key, value))
        while nested:  # iterative: a deeply nested object must not exhaust the stack
            prefix, obj = nested.pop()
            for key, value in obj.items():
                kind = type(value)
                if kind is float or kind is int:
                    out.append(_new_sample(Sample, (f"{prefix}/{key}", at, when, float(value))))
                elif kind is dict:
                    nested.append((f"{prefix}/{key}", value))
        for key, value in durations:
            out.append(_new_sample(Sample, (key, at, when, value)))
        if step is None and len(out) > before:
            self._counter += 1

    def snapshot(self) -> dict[str, Any]:
        return {"counter": self._counter}

    def restore(self, state: dict[str, Any]) -> None:
        counter = state.get("counter", 0)
        self._counter = counter if type(counter) is int and counter >= 0 else 0

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A JSONL file rewritten in place is read as new: no writer we know rewrites
        JSONL history, so lines cannot be matched against what was delivered; the
        step-less counter restarts with the file."""
