"""CSV metric logs: Lightning's CSVLogger `metrics.csv` and Keras' CSVLogger.

Lightning writes a sorted header with `step` (and usually `epoch`) and sparse
rows — train and validation metrics land on different rows, the other cells
empty. Keras writes `epoch` first, one row per epoch, `NA` for a metric missing
that epoch, and any separator the user chose. Neither writes a wall time, so
rows get `file_time` unless a `time`/`timestamp`/... column holds one (the same
rules as JSONL: see `jsonl.as_wall_time`).

Columns: the step is the first of the JSONL step keys present, else `epoch`
(Keras), else the row's index in the file. Every other column is a series —
Lightning's `epoch` included — except the step and time keys. Empty and
`NA`-like cells are "no point". A record is one line: quoted fields (commas
inside quotes) are parsed, quoted newlines are not supported because no
metric logger writes them, and treating every newline as a record end keeps a
stray quote from stalling the file forever.

The hard part is Lightning's header growth: when a metric first appears, it
reads the whole file back and rewrites it from the top (same inode) with the
new header, the old rows unchanged but for new empty cells, then appends. The
tailer notices the rewrite and hands us `continue_from(previous snapshot)`.
The snapshot carries how many data rows were delivered and the cells of the
first and last of them; if the new header contains the old columns and the
new first row has the same cells, the file is the old one rewritten and that
many rows are skipped. Otherwise — a restarted Keras job reopening the file
with "w", a new run — everything is read. A rewrite whose row at the
delivered count differs from what was delivered is reported, not hidden.
"""

from __future__ import annotations

import csv
from typing import Any

from trainsentry.point import Row
from trainsentry.sources.base import Decoded, DecodeError, Lines, Shapes
from trainsentry.sources.jsonl import STEP_KEYS, TIME_KEYS, as_step, as_wall_time
from trainsentry.sources.names import excerpt

_MISSING = frozenset({"", "NA", "N/A", "n/a", "None", "null"})
_RESERVED = frozenset(STEP_KEYS + TIME_KEYS)
_OTHER_DELIMITERS = ("\t", ";", "|")

Fingerprint = dict[str, str]
_new_row = tuple.__new__  # Row(...) goes through a Python-level __new__


def _fingerprint(header: list[str], cells: list[str]) -> Fingerprint:
    """A row's non-empty cells by column: what survives Lightning's rewrite unchanged."""
    return {name: cell.strip() for name, cell in zip(header, cells, strict=False) if cell.strip()}


class CsvDecoder:
    """Decodes a metrics CSV; the header and rewrite bookkeeping live in the snapshot."""

    def __init__(self) -> None:
        self._shapes = Shapes()  # the tags of a row: the header's, less its empty cells
        self._reset()

    def _reset(self) -> None:
        self._lines = Lines()
        self._header: list[str] | None = None
        self._delimiter = ","
        self._rows = 0  # data rows consumed from this file
        self._delivered = 0  # rows from the top known delivered; > _rows while skipping
        self._first: Fingerprint | None = None
        self._last_cells: list[str] | None = None
        self._restored_last: Fingerprint | None = None  # `last` of a restored snapshot
        self._expect_last: Fingerprint | None = None  # row `_delivered`, while skipping
        self._pending: dict[str, Any] | None = None  # the file before a rewrite
        self._reported: set[str] = set()
        self._layout()

    def _layout(self) -> None:
        """Precompute which column is what, once per header, not once per row."""
        header = self._header or []
        step_name = next((k for k in STEP_KEYS if k in header), None)
        if step_name is None and "epoch" in header:
            step_name = "epoch"
        self._step_index = header.index(step_name) if step_name is not None else None
        present = [k for k in TIME_KEYS if k in header]
        self._time_columns = [(header.index(k), k) for k in present]
        self._value_columns = [
            (i, name)
            for i, name in enumerate(header)
            if name not in _RESERVED and name != step_name
        ]

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        end, offset, lines, cut = self._lines.split(data)
        result = Decoded(consumed=end)
        if cut is not None:
            result.errors.append(cut)
        errors = result.errors
        for number, raw in enumerate(lines, self._lines.first(lines)):
            start = offset
            offset += len(raw) + 1
            text = raw.decode("utf-8", "replace")
            if text.endswith("\r"):
                text = text[:-1]
            if not text or text.isspace():
                continue
            if self._header is None:
                self._read_header(text)
                continue
            said = len(errors)
            self._read_row(text, start, file_time, result)
            for error in errors[said:]:
                error.line = number
        return result

    def _read_header(self, text: str) -> None:
        text = text.lstrip("\ufeff")
        if "," not in text:
            self._delimiter = next((d for d in _OTHER_DELIMITERS if d in text), ",")
        self._header = [name.strip() for name in self._split(text) or [text]]
        self._layout()

    def _split(self, text: str) -> list[str] | None:
        if '"' not in text:
            return text.split(self._delimiter)
        try:
            return next(csv.reader([text], delimiter=self._delimiter))
        except (csv.Error, StopIteration):
            return None

    def _read_row(self, text: str, start: int, file_time: float, result: Decoded) -> None:
        header = self._header
        assert header is not None
        cells = self._split(text)
        self._rows += 1
        self._last_cells = cells or []
        if self._rows == 1:
            self._first = _fingerprint(header, cells or [])
            self._match_rewrite()
        if self._rows <= self._delivered:
            if self._rows == self._delivered:
                self._check_last_delivered(cells or [], start, result)
            return
        self._delivered = self._rows
        if cells is None or len(cells) != len(header):
            count = "unparsable" if cells is None else f"{len(cells)} cells"
            message = f"row {self._rows}: {count}, header has {len(header)}"
            result.errors.append(DecodeError(start, message))
            return

        if self._step_index is None:
            step = self._rows - 1
        else:
            try:
                parsed = as_step(cells[self._step_index])
            except OverflowError as exc:  # a step no later stage could hold
                result.errors.append(DecodeError(start, f"row {self._rows}: {exc}"))
                return
            if parsed is None:
                self._report(header[self._step_index], cells[self._step_index], start, result)
                return
            step = parsed
        wall_time = file_time
        tags: list[str] = []
        values: list[float] = []
        if self._time_columns:
            wall_time = self._time_of(cells, step, file_time, start, result, tags, values)
        for index, name in self._value_columns:
            cell = cells[index]
            if cell in _MISSING:
                continue
            try:
                values.append(float(cell))
            except ValueError:
                if cell.strip() not in _MISSING:
                    self._report(name, cell, start, result)
            else:
                tags.append(name)
        if tags:
            shape = self._shapes(tuple(tags))
            result.rows.append(_new_row(Row, (step, wall_time, shape, tuple(values))))

    def _time_of(
        self,
        cells: list[str],
        step: int,
        file_time: float,
        start: int,
        result: Decoded,
        tags: list[str],
        values: list[float],
    ) -> float:
        """The row's wall time; a time column too small to be a date is a duration series."""
        wall_time: float | None = None
        durations: list[tuple[str, str]] = []
        for index, name in self._time_columns:
            cell = cells[index]
            seconds = as_wall_time(cell)
            if seconds is None:
                durations.append((name, cell))
            elif wall_time is None:
                wall_time = seconds
        if wall_time is None:
            wall_time = file_time
        for name, cell in durations:
            if cell.strip() not in _MISSING:
                try:
                    values.append(float(cell))
                except ValueError:
                    self._report(name, cell, start, result)
                else:
                    tags.append(name)
        return wall_time

    def _report(self, column: str, cell: str, start: int, result: Decoded) -> None:
        """One error per column: a column of strings must not flood the error count."""
        if column not in self._reported:
            self._reported.add(column)
            message = (
                f"column {excerpt(column)}: not a number: {excerpt(cell)} (later ones not reported)"
            )
            result.errors.append(DecodeError(start, message))

    def _match_rewrite(self) -> None:
        """On this file's first data row: is it the previous file rewritten?"""
        pending, self._pending = self._pending, None
        if pending is None or self._header is None:
            return
        same_columns = set(pending["header"]) <= set(self._header)
        if same_columns and pending["first"] == self._first and pending["delivered"] > 0:
            self._delivered = pending["delivered"]
            self._expect_last = pending["last"]

    def _check_last_delivered(self, cells: list[str], start: int, result: Decoded) -> None:
        assert self._header is not None
        expected, self._expect_last = self._expect_last, None
        if expected is not None and _fingerprint(self._header, cells) != expected:
            message = (
                f"file rewritten with a different row {self._rows}; "
                "the rows before it were taken as already delivered"
            )
            result.errors.append(DecodeError(start, message))

    def snapshot(self) -> dict[str, Any]:
        if self._rows < self._delivered:
            last = self._expect_last
        elif self._header is not None and self._last_cells is not None:
            last = _fingerprint(self._header, self._last_cells)
        else:
            last = self._restored_last
        return {
            "header": self._header,
            "delimiter": self._delimiter,
            "rows": self._rows,
            "delivered": max(self._delivered, self._rows),
            "first": self._first,
            "last": last,
            "reported": sorted(self._reported),
            "pending": self._pending,
            "skipping": self._lines.skipping,
            "line": self._lines.number,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Adopt a snapshot; one that does not parse leaves a fresh decoder, not a crash."""
        self._reset()
        try:
            header = state.get("header")
            if header is not None:
                self._header = [str(name) for name in header]
            delimiter = state.get("delimiter", ",")
            self._delimiter = (
                delimiter if isinstance(delimiter, str) and len(delimiter) == 1 else ","
            )
            self._rows = int(state.get("rows", 0))
            self._delivered = int(state.get("delivered", self._rows))
            self._first = _as_fingerprint(state.get("first"))
            self._restored_last = _as_fingerprint(state.get("last"))
            if self._rows < self._delivered:
                self._expect_last = self._restored_last
            self._reported = {str(c) for c in state.get("reported", ())}
            self._pending = _as_pending(state.get("pending"))
            self._lines.load(state)
        except (TypeError, ValueError, AttributeError):
            self._reset()
            return
        self._layout()

    def continue_from(self, previous: dict[str, Any]) -> None:
        pending = _as_pending(previous.get("pending"))
        if pending is None and previous.get("header") is not None:
            pending = _as_pending(previous)
        self._pending = pending


def _as_fingerprint(value: Any) -> Fingerprint | None:
    if not isinstance(value, dict):
        return None
    return {str(k): str(v) for k, v in value.items()}


def _as_pending(value: Any) -> dict[str, Any] | None:
    """The parts of a previous snapshot that identify what was delivered from it."""
    if not isinstance(value, dict) or not isinstance(value.get("header"), list):
        return None
    try:
        delivered = int(value.get("delivered", 0))
    except (TypeError, ValueError):
        return None
    return {
        "header": [str(name) for name in value["header"]],
        "delivered": delivered,
        "first": _as_fingerprint(value.get("first")),
        "last": _as_fingerprint(value.get("last")),
    }
