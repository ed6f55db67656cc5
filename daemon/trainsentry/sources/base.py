"""The seam between the tailer (files, offsets, rotation) and the decoders (bytes → rows).

A decoder never touches the file system: the tailer hands it the bytes from its
current offset on, and the decoder says how many of them formed complete
records. Bytes of a record still being written are left unconsumed and handed
again, longer, on the next read — so a partial record is neither lost nor
parsed twice. Whatever a decoder must remember across records (a CSV header,
TF1 plugin metadata seen on a tag's first event) goes into `snapshot()` so a
restarted daemon resuming mid-file decodes exactly as the one before it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from trainsentry.point import ProbeMark, Row, RunEnd, Sample, TextEvent, Trace, samples_of
from trainsentry.sources.names import safe_name


@dataclass(slots=True)
class DecodeError:
    """A skipped record: `offset` is relative to the start of the bytes fed; `line`, in a
    line format, is its line number in the file, which is what a person looks up."""

    offset: int
    message: str
    line: int | None = None


@dataclass(slots=True)
class Decoded:
    consumed: int
    rows: list[Row] = field(default_factory=list)  # one per record with values
    errors: list[DecodeError] = field(default_factory=list)
    events: list[TextEvent] = field(default_factory=list)  # text logs' events (textlog.py)
    trace: Trace = field(default_factory=dict)  # what the run was started with (run_trace.py)
    ends: list[RunEnd] = field(default_factory=list)  # a tracker's word that the run ended
    marks: list[ProbeMark] = field(default_factory=list)  # the probe's meta and end records

    @property
    def samples(self) -> list[Sample]:
        """The values one by one, in order (for readers that want them so)."""
        return samples_of(self.rows)


class Shapes:
    """One tags tuple per distinct shape of a decoder's records, so that rows of the
    same shape share it and consumers' caches keyed on it hit by identity. Bounded:
    a log whose every line has new keys must not grow it without end. Every decoder's
    tags pass here when first seen, so this is where they are made safe (names.py)."""

    __slots__ = ("_seen",)
    LIMIT = 4096

    def __init__(self) -> None:
        self._seen: dict[tuple[str, ...], tuple[str, ...]] = {}

    def __call__(self, tags: tuple[str, ...]) -> tuple[str, ...]:
        seen = self._seen.get(tags)
        if seen is None:
            if len(self._seen) >= self.LIMIT:
                self._seen.clear()
            safe = tuple(map(safe_name, tags))
            seen = self._seen[tags] = tags if safe == tags else safe
        return seen


class Decoder(Protocol):
    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        """Decode complete records at the start of `data`.

        `at_eof` is true when `data` runs to the current end of the file; a
        decoder may still leave a trailing incomplete record unconsumed.
        `file_time` is the file's mtime (for an append read live, the time of
        reading: FileTail._read_appended), the fallback wall time for formats
        whose records may lack one.
        """
        ...

    def snapshot(self) -> dict[str, Any]:
        """JSON-serialisable state needed to resume decoding at the current offset."""
        ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def continue_from(self, previous: dict[str, Any]) -> None:
        """Called on a fresh decoder when the same path was rewritten in place.

        Lightning's CSVLogger rewrites metrics.csv from the top when a new
        column appears; a decoder that can tell a rewrite from a new file uses
        the previous snapshot to skip records already delivered.
        """
        ...


# The largest record any format may have (a line, an event): a larger one is skipped
# and counted, and reading goes on after it. Training logs' records are bytes to
# kilobytes; an image summary may be megabytes. The tailer reads up to twice this
# at once to find a record's end, so the bound is also the daemon's largest read.
MAX_RECORD_BYTES = 16 << 20


class Lines:
    """The newline-terminated lines at the start of the bytes fed, for line formats,
    and the file's line number of each.

    The bytes after the last newline are a line still being written, left for
    the next read even at end of file. A line that has grown past
    MAX_RECORD_BYTES with no end in sight is no record of any writer's: it is
    skipped, with one error, up to its newline whenever that comes (`skipping`
    is part of the decoder's snapshot), so a runaway line or a log written
    without newlines cannot stop the file.

    `number` counts the lines ended so far, a skipped one included, so that
    line N is what `grep -n` and an editor call line N: evidence quoted as
    `path:line` must lead to the line, whatever was skipped before it. Only a
    newline ends a line: a progress bar's carriage returns redraw one.
    """

    __slots__ = ("number", "skipping")

    def __init__(self) -> None:
        self.skipping = False
        self.number = 0  # lines ended in the bytes consumed so far

    def split(self, data: bytes | memoryview) -> tuple[int, int, list[bytes], DecodeError | None]:
        """(bytes consumed, offset of the first line, the lines, the error of a cut line).

        The first line's number is then `number - len(lines) + 1` (`first`)."""
        raw = data if isinstance(data, bytes) else bytes(data)
        end, start, count, cut = self.span(raw)
        if not count:
            return end, start, [], cut
        lines = raw[start:end].split(b"\n")
        lines.pop()
        return end, start, lines, cut

    def span(self, raw: bytes) -> tuple[int, int, int, DecodeError | None]:
        """As `split`, with how many lines `raw[start:end]` holds in place of the lines:
        for a decoder that reads them where they lie (textlog.py)."""
        start = 0
        if self.skipping:
            newline = raw.find(b"\n")
            if newline < 0:
                return len(raw), len(raw), 0, None
            self.skipping, start = False, newline + 1
            self.number += 1  # the skipped line ends here
        end = raw.rfind(b"\n") + 1
        if end <= start:
            if len(raw) - start < MAX_RECORD_BYTES:
                return start, start, 0, None
            self.skipping = True
            why = f"a line longer than {MAX_RECORD_BYTES >> 20} MB, the record limit: skipped"
            return len(raw), len(raw), 0, DecodeError(start, why, self.number + 1)
        count = raw.count(b"\n", start, end)
        self.number += count
        return end, start, count, None

    def first(self, lines: list[bytes]) -> int:
        """The line number of the first of the lines `split` just returned."""
        return self.number - len(lines) + 1

    def save(self, state: dict[str, Any]) -> dict[str, Any]:
        """`state` with where the lines stand (a decoder's snapshot)."""
        state["line"] = self.number
        if self.skipping:
            state["skipping"] = True
        return state

    def load(self, state: dict[str, Any]) -> None:
        line = state.get("line", 0)
        self.number = line if type(line) is int and line >= 0 else 0
        self.skipping = state.get("skipping") is True
