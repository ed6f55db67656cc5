"""Jobs' text logs (`*.log`, `*.out`, `*.err`): read as what they hold, not as what they are named.

A `.log` is whatever its writer made of it. Keras' CSVLogger writes its
metrics to `training.log` (its docs' name); structlog and python-json-logger
write JSON lines; a Slurm job's `slurm-123.out` and torchrun's
`stdout.log`/`stderr.log` are plain text. So the first complete line decides,
once, and the decision is part of the snapshot (a restart resumes as before):

- a CSV header (two or more comma-separated names, no spaces, no numbers
  only) → the CSV decoder, exactly as for a `.csv`;
- a JSON object → the JSONL decoder for the metrics, and each record with a
  message (`message`, `msg`, `event`) or a level becomes a text event too,
  its level (`level`, `levelname`, `severity`) kept, its exception text
  (`exc_info`, `exception`, `stack_info`, `traceback`) as further lines;
- anything else → text: lines grouped into events (text_events.py), the
  plain lines between them passed on together (text_scan.py).

Every line is masked for secrets (secrets.py) before it leaves this module.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from orjson import loads as _loads

from trainsentry.point import TextEvent
from trainsentry.sources.base import MAX_RECORD_BYTES, Decoded, Decoder, Lines
from trainsentry.sources.csvlog import CsvDecoder
from trainsentry.sources.jsonl import JsonlDecoder
from trainsentry.sources.secrets import mask_secrets
from trainsentry.sources.text_events import Grouped, Grouper, clean, level_of
from trainsentry.sources.text_scan import next_worked, plain_event

_CSV_HEADER = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*(?:[,;\t][A-Za-z_][A-Za-z0-9_./-]*)+\r?$")
_MESSAGE_KEYS = ("message", "msg", "event")
_LEVEL_KEYS = ("level", "levelname", "severity", "log.level")
_DETAIL_KEYS = ("exc_info", "exception", "stack_info", "traceback", "stack")
_LEVELS = {"warn": "warning", "fatal": "critical", "err": "error", "crit": "critical"}
_ALONE = 63  # lines read one by one at most between two scans (TextDecoder.feed)


def sniff(first_line: bytes) -> str:
    """The format of a file from its first non-empty line: "csv", "jsonl" or "text"."""
    text = first_line.strip()
    if text.startswith(b"{"):
        try:
            if type(_loads(text)) is dict:
                return "jsonl"
        except ValueError:
            pass
        return "text"
    if _CSV_HEADER.match(first_line.decode("utf-8", "replace").strip()):
        return "csv"
    return "text"


class TextDecoder:
    """Plain text: numbered lines grouped into events. No rows, ever."""

    def __init__(self) -> None:
        self._lines = Lines()  # and the line numbers
        self._grouper = Grouper()
        self._held_wall = math.nan  # when the lines of a held event were read

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        raw = data if isinstance(data, bytes) else bytes(data)
        end, pos, count, cut = self._lines.span(raw)
        result = Decoded(consumed=end)
        if cut is not None:
            result.errors.append(cut)
        events = result.events
        found: list[Grouped] = []
        grouper = self._grouper
        number = self._lines.number - count + 1
        # Where lines that need Python come in a row, a scan a line costs more than it
        # saves (3 µs): after a scan that found the very line it started at, the lines
        # after it are read one by one (1, 3, 7, ... up to _ALONE, a plain one among them
        # making the line event it stands for) before the next scan.
        alone = streak = 0
        while pos < end:
            if alone:
                alone -= 1
            elif not grouper.holding:  # plain lines up to the next that needs Python
                worked = next_worked(raw, pos, end)
                if worked == pos:
                    alone = streak = min(2 * streak + 1, _ALONE)
                else:
                    streak = 0
                if worked > pos:
                    text, worked = _plain_text(raw, pos, worked)
                    if text and not text.isspace():
                        events.append(plain_event(text, number, file_time))
                    number += raw.count(b"\n", pos, worked)
                    pos = worked
                    if pos >= end:
                        break
            newline = raw.index(b"\n", pos)
            text, after = clean(raw[pos:newline].decode("utf-8", "replace"))
            grouper.push(number, mask_secrets(text, after), found, after)
            if found:
                events.extend(_event(g, file_time) for g in found)
                found.clear()
            number, pos = number + 1, newline + 1
        if count and grouper.holding:
            self._held_wall = file_time
        return result

    @property
    def holding(self) -> bool:
        """An event is held for lines that may continue it (a chained exception)."""
        return self._grouper.holding

    def let_go(self) -> list[TextEvent]:
        """The held event, as it is: nothing came to continue it (text_events.py)."""
        found: list[Grouped] = []
        self._grouper.flush(found)
        wall = self._held_wall if math.isfinite(self._held_wall) else time.time()
        return [_event(g, wall) for g in found]

    def snapshot(self) -> dict[str, Any]:
        return self._lines.save(self._grouper.snapshot())

    def restore(self, state: dict[str, Any]) -> None:
        self._lines.load(state)
        self._grouper.restore(state)

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A log rewritten in place (copytruncate) is a new log: read from its first line."""


def _plain_text(raw: bytes, pos: int, end: int) -> tuple[str, int]:
    """The plain lines `raw[pos:end]` decoded, and where they end: before the first line
    that is not UTF-8, which is read line by line (its bad bytes replaced)."""
    try:
        return raw[pos : end - 1].decode("utf-8"), end
    except UnicodeDecodeError as exc:
        bad = raw.rfind(b"\n", pos, pos + exc.start) + 1 or pos
        return raw[pos : max(pos, bad - 1)].decode("utf-8"), bad


def _event(g: Grouped, file_time: float) -> TextEvent:
    level = "error" if g.kind != "line" else level_of(g.lines[0])
    return TextEvent("", g.line, file_time, tuple(g.lines), g.kind, level, "", g.cuts)


def record_event(record: dict[str, Any], number: int, file_time: float) -> TextEvent | None:
    """The text event of a structured log record; None for a record with no message or level."""
    message = next((record[k] for k in _MESSAGE_KEYS if isinstance(record.get(k), str)), None)
    raw_level = next((record[k] for k in _LEVEL_KEYS if isinstance(record.get(k), str)), None)
    if message is None and raw_level is None:
        return None
    level = (raw_level or "").lower()
    level = _LEVELS.get(level, level)
    head = f"{level.upper()} {message}" if level and message is not None else message or level
    lines: list[str] = []
    cuts: list[tuple[int, str]] = []
    for raw in _record_lines(record, head):
        text, after = clean(raw)
        if after:
            cuts.append((len(lines), after))
        lines.append(mask_secrets(text, after))
    return TextEvent("", number, file_time, tuple(lines), "record", level, "", tuple(cuts))


def _record_lines(record: dict[str, Any], head: str) -> list[str]:
    """The record's message line, then the lines of its exception text."""
    lines = [head]
    for key in _DETAIL_KEYS:
        detail = record.get(key)
        if isinstance(detail, str) and detail and detail not in ("True", "true"):
            lines += [x for x in detail.splitlines() if x.strip()]
    return lines


class LogDecoder:
    """A `.log`/`.out`/`.err`: sniffs its first line, then decodes as that format."""

    def __init__(self) -> None:
        self._mode = ""
        self._inner: Decoder | None = None
        self._previous: dict[str, Any] | None = None  # the snapshot before a rewrite
        self._events: list[TextEvent] = []  # JSON mode: the records' events of this feed
        self._file_time = 0.0

    def _choose(self, mode: str) -> None:
        self._mode = mode
        kinds: dict[str, type[Decoder]] = {
            "text": TextDecoder, "csv": CsvDecoder, "jsonl": JsonlDecoder,
        }  # fmt: skip
        self._inner = kinds[mode]()
        if isinstance(self._inner, JsonlDecoder):
            self._inner.on_record = self._record

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        if self._inner is None:
            raw = data if isinstance(data, bytes) else bytes(data)
            start = len(raw) - len(raw.lstrip())
            newline = raw.find(b"\n", start)
            if newline >= 0:
                self._choose(sniff(raw[start:newline]))
            elif len(raw) - start >= MAX_RECORD_BYTES:
                self._choose("text")  # a first line over the limit is no header: text skips it
            else:
                return Decoded(consumed=0)  # the first line is still being written
            previous, self._previous = self._previous, None
            inner = previous.get("inner") if previous else None
            if previous and previous.get("mode") == self._mode and isinstance(inner, dict):
                assert self._inner is not None
                self._inner.continue_from(inner)
        assert self._inner is not None
        self._file_time = file_time
        decoded = self._inner.feed(data, at_eof=at_eof, file_time=file_time)
        if self._events:
            decoded.events, self._events = self._events, []
        return decoded

    def _record(self, record: dict[str, Any], number: int) -> None:
        """A JSON record as the JSONL decoder read it, with its line number: its event."""
        event = record_event(record, number, self._file_time)
        if event is not None:
            self._events.append(event)

    def snapshot(self) -> dict[str, Any]:
        if self._inner is None:
            return {}
        return {"mode": self._mode, "inner": self._inner.snapshot()}

    def restore(self, state: dict[str, Any]) -> None:
        mode = state.get("mode")
        if mode in ("text", "csv", "jsonl"):
            self._choose(mode)
            assert self._inner is not None
            inner = state.get("inner")
            self._inner.restore(inner if isinstance(inner, dict) else {})

    def continue_from(self, previous: dict[str, Any]) -> None:
        """Rewritten in place: sniffed afresh; a CSV rewritten as CSV keeps its bookkeeping
        (Lightning-style header growth, csvlog.py)."""
        self._previous = previous

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def holding(self) -> bool:
        return isinstance(self._inner, TextDecoder) and self._inner.holding

    def let_go(self) -> list[TextEvent]:
        return self._inner.let_go() if isinstance(self._inner, TextDecoder) else []
