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
- anything else → text: lines grouped into events (text_events.py).

Every line is masked for secrets (secrets.py) before it leaves this module.
"""

from __future__ import annotations

import math
import re
import time
from typing import Any

from orjson import loads as _loads

from trainsentry.point import TextEvent
from trainsentry.sources.base import Decoded, Decoder, Lines
from trainsentry.sources.csvlog import CsvDecoder
from trainsentry.sources.jsonl import JsonlDecoder
from trainsentry.sources.secrets import mask_secrets
from trainsentry.sources.text_events import Grouped, Grouper, clean, level_of

_CSV_HEADER = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*(?:[,;\t][A-Za-z_][A-Za-z0-9_./-]*)+\r?$")
_MESSAGE_KEYS = ("message", "msg", "event")
_LEVEL_KEYS = ("level", "levelname", "severity", "log.level")
_DETAIL_KEYS = ("exc_info", "exception", "stack_info", "traceback", "stack")
_LEVELS = {"warn": "warning", "fatal": "critical", "err": "error", "crit": "critical"}


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
        self._lines = Lines()
        self._number = 0  # lines consumed so far
        self._grouper = Grouper()
        self._held_wall = math.nan  # when the lines of a held event were read

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        end, _, lines, cut = self._lines.split(data)
        result = Decoded(consumed=end)
        if cut is not None:
            result.errors.append(cut)
        found: list[Grouped] = []
        grouper = self._grouper
        for raw in lines:
            self._number += 1
            text, after = clean(raw.decode("utf-8", "replace"))
            grouper.push(self._number, mask_secrets(text), found, after)
        if lines and grouper.holding:
            self._held_wall = file_time
        result.events = [_event(g, file_time) for g in found]
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
        state: dict[str, Any] = {"line": self._number, **self._grouper.snapshot()}
        if self._lines.skipping:
            state["skipping"] = True
        return state

    def restore(self, state: dict[str, Any]) -> None:
        line = state.get("line", 0)
        self._number = line if type(line) is int and line >= 0 else 0
        self._lines.skipping = state.get("skipping") is True
        self._grouper.restore(state)

    def continue_from(self, previous: dict[str, Any]) -> None:
        """A log rewritten in place (copytruncate) is a new log: read from its first line."""


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
        lines.append(mask_secrets(text))
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
        self._number = 0  # lines consumed (JSON mode; text counts its own)
        self._previous: dict[str, Any] | None = None  # the snapshot before a rewrite

    def _choose(self, mode: str) -> None:
        self._mode = mode
        kinds: dict[str, type[Decoder]] = {
            "text": TextDecoder, "csv": CsvDecoder, "jsonl": JsonlDecoder,
        }  # fmt: skip
        self._inner = kinds[mode]()

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        if self._inner is None:
            raw = data if isinstance(data, bytes) else bytes(data)
            start = len(raw) - len(raw.lstrip())
            newline = raw.find(b"\n", start)
            if newline < 0:
                return Decoded(consumed=0)  # the first line is still being written
            self._choose(sniff(raw[start:newline]))
            previous, self._previous = self._previous, None
            inner = previous.get("inner") if previous else None
            if previous and previous.get("mode") == self._mode and isinstance(inner, dict):
                assert self._inner is not None
                self._inner.continue_from(inner)
        assert self._inner is not None
        decoded = self._inner.feed(data, at_eof=at_eof, file_time=file_time)
        if self._mode == "jsonl" and decoded.consumed:
            self._records(bytes(data[: decoded.consumed]), file_time, decoded)
        return decoded

    def _records(self, consumed: bytes, file_time: float, out: Decoded) -> None:
        for line in consumed.split(b"\n")[:-1]:
            self._number += 1
            if not line.lstrip().startswith(b"{"):
                continue
            try:
                record = _loads(line)
            except ValueError:
                continue  # the JSONL decoder said so already
            if type(record) is dict:
                event = record_event(record, self._number, file_time)
                if event is not None:
                    out.events.append(event)

    def snapshot(self) -> dict[str, Any]:
        if self._inner is None:
            return {}
        return {"mode": self._mode, "line": self._number, "inner": self._inner.snapshot()}

    def restore(self, state: dict[str, Any]) -> None:
        mode = state.get("mode")
        if mode in ("text", "csv", "jsonl"):
            self._choose(mode)
            assert self._inner is not None
            line = state.get("line", 0)
            self._number = line if type(line) is int and line >= 0 else 0
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
