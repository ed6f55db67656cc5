"""JSON Lines metric logs: one object per line, as written by hand-rolled loggers,
mmengine, the HF Trainer's `log_history` dumps, wandb exports and our own probe.

A line is a record only once its newline has been written: a writer flushes a
line in pieces, so a trailing line without a newline is left unconsumed even at
EOF, and is parsed once, whole, on a later read. Lines are split with
`bytes.split` and parsed by orjson (json's C scanner for what orjson refuses,
see `_parse`); a line of the keys seen before is then read by one planned
getter, so a 10 MB line or a million short ones cost about what the JSON
parser costs.

What counts as a metric (decided here, relied on by rules and the probe):

- numbers (ints and floats, including the `NaN`/`Infinity` literals Python's
  json writes) are values, and so are the words loggers that write
  `str(value)` use for the non-finite ones (`"nan"`, `"inf"`, `"-inf"`,
  `"infinity"`, any case, with a sign); a `null` is a NaN where the file has
  written numbers in its place (orjson, pandas and JavaScript write NaN as
  null), else nothing (written_nulls.py says which); other strings, bools and
  lists are not values — a list is ignored rather than exploded into
  `tag/0, tag/1, ...` because no common writer logs scalars that way and
  per-element series would be noise;
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
  key — the probe's first record) and records with no value produce nothing;
  the probe's meta and end records become marks of the run's process
  (probe_marks.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from json.scanner import make_scanner
from operator import itemgetter
from typing import Any

from orjson import JSONDecodeError as _OrjsonError
from orjson import loads as _orjson_loads

from trainsentry.point import Row
from trainsentry.sources.base import Decoded, DecodeError, Lines, Shapes
from trainsentry.sources.names import safe_name
from trainsentry.sources.probe_marks import is_mark, mark_of
from trainsentry.sources.run_trace import TraceMemory, flatten
from trainsentry.sources.written_nulls import WrittenNulls

STEP_KEYS = ("step", "global_step", "iteration", "iter", "_step")
TIME_KEYS = ("time", "timestamp", "wall_time", "_timestamp")
_RESERVED = frozenset(STEP_KEYS + TIME_KEYS)

# 1e8 s is March 1973: no training log predates it, and no per-step duration
# reaches it. Above 1e11 s (year 5138) the number is in finer units.
_EARLIEST_EPOCH = 1e8
_LATEST_EPOCH = 1e11


STEP_MIN, STEP_MAX = -(1 << 63), (1 << 63) - 1  # TensorBoard's int64, and the store's

# What `str(value)` writes for a non-finite float, in Python ("nan", "inf"), C and
# Rust ("-nan", "NaN"), JavaScript ("Infinity"): the words float() reads, no others.
_NON_FINITE = {
    sign + word: float(sign + word)
    for sign in ("", "+", "-")
    for word in ("nan", "inf", "infinity")
}
_NON_FINITE_CHARS = max(map(len, _NON_FINITE))


def non_finite_word(text: str) -> float | None:
    """The float a non-finite word spells (`"NaN"`, `"-inf"`, `"Infinity"`); None for other text."""
    if len(text) > _NON_FINITE_CHARS:
        return None
    return _NON_FINITE.get(text.lower())


def as_step(value: Any) -> int | None:
    """A step from a JSON value or CSV cell text; None when it is not a finite number.

    Raises OverflowError for a number outside STEP_MIN..STEP_MAX (a 400-digit
    step): such a record is bad, not a record without a step, and a step every
    later stage can hold as a 64-bit integer or a double is what they assume.
    """
    kind = type(value)
    step: int
    if kind is int:
        step = value
    elif kind is str:
        try:
            step = int(value)
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return None
            if number != number or number in (float("inf"), float("-inf")):
                return None
            step = int(number)
    elif kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return None
        step = int(value)
    else:
        return None
    if not STEP_MIN <= step <= STEP_MAX:
        raise OverflowError("step outside the 64-bit range")
    return step


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
_new_row = tuple.__new__  # Row(...) goes through a Python-level __new__


def _parse(line: bytes) -> Any:
    """One line's JSON value; raises ValueError (or RecursionError) when it is not JSON.

    orjson first: it parses a 20-value line in about a ninth of the time of
    json's C scanner (1.2 vs 10.8 µs measured, the largest cost of reading a
    live JSONL log). What it refuses — the NaN and Infinity literals Python's
    json writes (a diverged loss), numbers beyond a double, invalid text —
    goes to json, which accepts the literals and words the errors. One
    difference remains: an integer beyond 64 bits comes back a float (equal
    once made a value; a step that large is clipped by the store anyway).
    """
    try:
        return _orjson_loads(line)
    except _OrjsonError:
        pass
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


_NAN = float("nan")
_NUMBERS = frozenset((float, int))
_FLOATS = frozenset((float,))
_MARKS = frozenset(("kind", "type", "_meta"))
# A line's keys -> how to read a flat line of them: the step and time keys it
# has (in the order they are tried), a getter of its metric values, their tags.
_Getter = Callable[[dict[str, Any]], tuple[Any, ...]]
_Plan = tuple[tuple[str, ...], tuple[str, ...], _Getter, tuple[str, ...]]


_PLANS: dict[tuple[str, ...], _Plan | None] = {}
_SHAPES = Shapes()


class JsonlDecoder:
    """Decodes JSON Lines; the only state is the counter for step-less lines.

    A writer's lines nearly always have the same keys, so what a line of given
    keys means is worked out once (`_plan`) and a flat line of numbers is then
    read by one C-level getter and a type check of its values: a 20-value line
    costs about what the JSON parser does. Anything else (nested objects,
    strings, bools, durations, metadata) takes the general path, which says
    the same for it: the fast path changes speed, never results.
    """

    def __init__(self) -> None:
        self._counter = 0
        self._lines = Lines()  # and their numbers: a mark's, an error's, an event's
        # each JSON object read, with its line number: a `.log` of JSON records makes
        # events of them (textlog.LogDecoder) without parsing every line again
        self.on_record: Callable[[dict[str, Any], int], None] | None = None
        # shared by every JSONL file: a fleet's logs have the same keys, so one plan
        # and one tags tuple serve them all (and stay in the CPU's caches)
        self._plans = _PLANS
        self._shapes = _SHAPES
        self._memory = TraceMemory()  # what metadata records told (_meta)
        self._nulls = WrittenNulls()  # which nulls are NaN
        self._feeding: Decoded | None = None

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        end, offset, lines, cut = self._lines.split(data)
        result = Decoded(consumed=end)
        self._memory.resend(result)
        if cut is not None:
            result.errors.append(cut)
        if not lines:
            return result
        self._feeding = result
        rows, errors = result.rows, result.errors
        first = self._lines.first(lines)
        on_record = self.on_record
        for i, line in enumerate(lines):
            start = offset
            offset += len(line) + 1
            if not line or line.isspace():
                continue
            try:
                record = _parse(line)
            except (ValueError, RecursionError) as exc:
                errors.append(DecodeError(start, f"invalid JSON line: {exc}", first + i))
                continue
            if type(record) is not dict:
                why = f"not a JSON object: {type(record).__name__}"
                errors.append(DecodeError(start, why, first + i))
                continue
            if on_record is not None:
                on_record(record, first + i)
            try:
                marked = self._decode(record, file_time, rows)
            except OverflowError as exc:  # an integer beyond float range
                errors.append(DecodeError(start, f"number out of range: {exc}", first + i))
                continue
            if marked:  # rare (a probe file's first and last lines)
                result.marks.append(mark_of(record, first + i, file_time))
        return result

    def _plan(self, keys: tuple[str, ...]) -> _Plan | None:
        plan: _Plan | None = None
        metrics = tuple(k for k in keys if k not in _RESERVED)
        if metrics and _MARKS.isdisjoint(keys) and len(set(metrics)) == len(metrics):
            getter: _Getter
            if len(metrics) > 1:
                getter = itemgetter(*metrics)
            else:
                only = metrics[0]
                getter = lambda record: (record[only],)  # noqa: E731  # itemgetter of one key returns no tuple
            steps = tuple(k for k in STEP_KEYS if k in keys)
            times = tuple(k for k in TIME_KEYS if k in keys)
            plan = (steps, times, getter, self._shapes(metrics))
        if len(self._plans) >= Shapes.LIMIT:
            self._plans.clear()
        self._plans[keys] = plan
        return plan

    def _decode(self, record: dict[str, Any], file_time: float, out: list[Row]) -> bool:
        """Rows of the record into `out`; True when it is a mark of the probe instead."""
        keys = tuple(record)
        try:
            plan = self._plans[keys]
        except KeyError:
            plan = self._plan(keys)
        if plan is not None:
            step_keys, time_keys, getter, tags = plan
            values = getter(record)
            kinds = set(map(type, values))
            if kinds <= _NUMBERS:
                step: int | None = None
                wall_time: float | None = None
                for key in step_keys:
                    value = record[key]
                    if type(value) is dict:
                        break  # flattened into series: the general path's
                    if step is None:
                        step = as_step(value)
                else:
                    for key in time_keys:
                        value = record[key]
                        seconds = as_wall_time(value)
                        if seconds is None:
                            kind = type(value)
                            if kind is float or kind is int or kind is dict:
                                break  # a duration or an object: series, the general path's
                        elif wall_time is None:
                            wall_time = seconds
                    else:
                        if kinds != _FLOATS:
                            values = tuple(map(float, values))
                        if step is None:
                            step = self._counter
                            self._counter += 1
                        when = file_time if wall_time is None else wall_time
                        out.append(_new_row(Row, (step, when, tags, values)))
                        self._nulls.numbers(tags)
                        return False
        return self._decode_any(record, file_time, out)

    def _decode_any(self, record: dict[str, Any], file_time: float, out: list[Row]) -> bool:
        if "kind" in record or "type" in record or "_meta" in record:
            meta = _is_meta(record)
            if meta and self._feeding is not None:  # the run's trace (a probe's meta too)
                self._meta(record, self._feeding)
            if is_mark(record):
                return True
            if meta:
                return False
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
        tags: list[str] = []
        values: list[float] = []
        nested: list[tuple[str, dict[str, Any]]] = []
        nulls: list[str] = []
        for key, value in record.items():
            kind = type(value)
            if kind is float:
                if key not in _RESERVED:
                    tags.append(key)
                    values.append(value)
            elif kind is int:
                if key not in _RESERVED:
                    values.append(float(value))
                    tags.append(key)
            elif kind is dict:
                nested.append((key, value))
            elif kind is str:
                number = non_finite_word(value)
                if number is not None and key not in _RESERVED:
                    tags.append(key)
                    values.append(number)
            elif value is None and key not in _RESERVED:
                nulls.append(key)
        while nested:  # iterative: a deeply nested object must not exhaust the stack
            prefix, obj = nested.pop()
            for key, value in obj.items():
                kind = type(value)
                if kind is float or kind is int:
                    values.append(float(value))
                    tags.append(f"{prefix}/{key}")
                elif kind is dict:
                    nested.append((f"{prefix}/{key}", value))
                elif kind is str:
                    number = non_finite_word(value)
                    if number is not None:
                        tags.append(f"{prefix}/{key}")
                        values.append(number)
                elif value is None:
                    nulls.append(f"{prefix}/{key}")
        for key, value in durations:
            tags.append(key)
            values.append(value)
        if not tags and not nulls:
            return False
        shape = self._shapes(tuple(tags))
        if tags:
            self._nulls.numbers(shape)
        if nulls:
            nan = self._nulls.as_nan(shape, tuple(map(safe_name, nulls)))
            if nan:
                tags.extend(nan)
                values.extend([_NAN] * len(nan))
                shape = self._shapes(tuple(tags))
        if not tags:
            return False
        at = self._counter if step is None else step
        if step is None:
            self._counter += 1
        when = file_time if wall_time is None else wall_time
        out.append(_new_row(Row, (at, when, shape, tuple(values))))
        return False

    def _meta(self, record: dict[str, Any], out: Decoded) -> None:
        """A metadata record (the probe's meta record: host, git commit, seed, hparams) is
        the run's trace: its hparams as `params`, the rest as `meta`; lists are left out
        (the probe's layer names are no identity of a run)."""
        meta: list[tuple[str, str]] = []
        for key, value in record.items():
            if key not in _MARKS and key != "hparams":
                flatten(key, value, meta, lists=False)
        params: list[tuple[str, str]] = []
        hparams = record.get("hparams")
        if isinstance(hparams, dict):
            for key, value in hparams.items():
                flatten(str(key), value, params, lists=False)
        self._memory.add(out, "meta", meta)
        self._memory.add(out, "params", params)

    def snapshot(self) -> dict[str, Any]:
        state = self._lines.save({"counter": self._counter})
        nulls = self._nulls.snapshot()
        if nulls:
            state["nulls"] = nulls
        return self._memory.snapshot(state)

    def restore(self, state: dict[str, Any]) -> None:
        counter = state.get("counter", 0)
        self._counter = counter if type(counter) is int and counter >= 0 else 0
        self._lines.load(state)
        self._nulls.restore(state.get("nulls"))
        self._memory.restore(state)

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A JSONL file rewritten in place is read as new: no writer we know rewrites
        JSONL history, so lines cannot be matched against what was delivered; the
        step-less counter restarts with the file."""
