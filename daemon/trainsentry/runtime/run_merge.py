"""A run's files merged live as `replay` merges them: a step is judged once all of it is in.

Replay reads a run's files whole and merges them by wall time (reading.iter_points),
so a step's values from MLflow's file per metric, or Keras' train/ and validation/
writers, are judged as one moment, after every earlier step. Live, the files are
read as they grow, each at its own pace: one cycle may find the lr at step 305 and
the loss still at 304. Judged at once, the lr's jump is paired with the loss of
the step before and the verdict differs from replay's.

So the rows of a run with several files wait here until every other file of the
run that is still being written has reached them in replay's order (wall time,
then step: a file writes its rows in that order, and a Keras train/ file's steps
count batches and epochs in turn, so the step alone is no frontier), then leave
in that order, ties to the file that sorts first. What bounds the wait is the writers' own
pace, not a count of steps: a file that has not grown for `grace` seconds no
longer holds the others back (a validation file written every 50 steps, a run
that ended), and no row waits longer than `grace` in any case (files whose clocks
disagree). A run with a single file, the common case, is never
held. The verdict equals replay's whenever a run's files are flushed within
`grace` of each other; writers that buffer for minutes (SummaryWriter's
flush_secs=120) can still be judged in another order than replay's, as they
would be by anyone reading them live.

Rows held are not yet judged, so the read position a commit or a restart's
snapshot saves for such a file is the one before its first held row (`safe`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from trainsentry.point import Row
from trainsentry.sources.reading import wall_order
from trainsentry.state.db import Checkpoint

# How long a file that stopped growing still holds its run's other files back, and
# the longest a row waits: 2 s is 20 of the loop's read cycles, ample for writers
# flushing the same step side by side (MLflow appends a metric line per call, a
# tracker's files are flushed in the same burst), while a NaN's page waits at most
# that long more on a run whose files fell out of step.
MERGE_GRACE_SECONDS = 2.0


@dataclass(slots=True)
class _Read:
    """One read of a file whose rows are still (partly) held."""

    rows: list[Row]
    at: float  # when it was read (monotonic)
    before: Checkpoint | None  # the file's read position before it
    next: int = 0  # the first row not yet let go


@dataclass(slots=True)
class _File:
    key: str
    # replay's order key of its last row read: it has written everything before
    last: tuple[float, int] = (-math.inf, -(2**63))
    grew: float = -math.inf  # when rows were last read from it
    more: bool = False  # its last read stopped at the budget: it is being read still
    reads: deque[_Read] = field(default_factory=deque)

    def head(self) -> Row:
        read = self.reads[0]
        return read.rows[read.next]


@dataclass(slots=True)
class _Run:
    files: dict[str, _File] = field(default_factory=dict)


class RunMerge:
    """The rows of runs with several files, held until the run's other files catch up."""

    def __init__(self, grace: float = MERGE_GRACE_SECONDS) -> None:
        self.grace = grace
        self._runs: dict[str, _Run] = {}
        self._held: set[str] = set()  # runs with rows held

    @property
    def holding(self) -> bool:
        return bool(self._held)

    def add(
        self,
        run: str,
        key: str,
        rows: list[Row],
        *,
        now: float,
        more: bool,
        before: Checkpoint | None,
    ) -> list[Row]:
        """A read of one of `run`'s files; the run's rows that may be judged now, in order."""
        state = self._runs.get(run)
        if state is None:
            state = self._runs[run] = _Run()
        file = state.files.get(key)
        if file is None:  # a file just made is being written: its first rows are coming
            file = state.files[key] = _File(key, grew=now)
        file.more = more
        if not rows:
            return self._let_go(run, state, now) if run in self._held else []
        file.grew = now
        file.last = wall_order(rows[-1])
        if run not in self._held and not self._others_behind(state, file, now):
            return rows  # nothing waits and no other file is behind this one: no copy
        file.reads.append(_Read(rows, now, before))
        self._held.add(run)
        return self._let_go(run, state, now)

    def due(self, now: float) -> float | None:
        """When a held run may next let rows go (monotonic): a held row's wait ends, or a
        file holding it back stops counting as written; None with nothing held."""
        times = [
            t + self.grace
            for run in self._held
            for f in self._runs[run].files.values()
            for t in (f.grew, *(r.at for r in f.reads))
            if t + self.grace > now
        ]
        return min(times, default=None)

    def release(self, now: float) -> list[tuple[str, list[Row]]]:
        """Every held run's rows whose wait is over, run by run."""
        out = []
        for run in sorted(self._held):
            rows = self._let_go(run, self._runs[run], now)
            if rows:
                out.append((run, rows))
        return out

    def flush(self, run: str | None = None) -> list[tuple[str, list[Row]]]:
        """All that is held (of `run`, or of every run), in replay's order: what ends a run
        (its tracker's final status, its process gone) or the daemon comes after it."""
        runs = sorted(self._held) if run is None else [run] if run in self._held else []
        out = []
        for name in runs:
            rows = self._let_go(name, self._runs[name], math.inf)
            if rows:
                out.append((name, rows))
        return out

    def safe(self, key: str, run: str) -> Checkpoint | None:
        """The read position of `key` before its first held row; None when none is held."""
        state = self._runs.get(run)
        file = state.files.get(key) if state is not None else None
        if file is None or not file.reads:
            return None
        return file.reads[0].before

    def forget(self, run: str, key: str) -> None:
        state = self._runs.get(run)
        if state is None:
            return
        state.files.pop(key, None)
        if not state.files:
            del self._runs[run]
            self._held.discard(run)

    def _others_behind(self, state: _Run, file: _File, now: float) -> bool:
        return any(
            other is not file and _behind(other.last, file.last) and self._writing(other, now)
            for other in state.files.values()
        )

    def _writing(self, file: _File, now: float) -> bool:
        return file.more or now - file.grew < self.grace

    def _let_go(self, run: str, state: _Run, now: float) -> list[Row]:
        """The held rows in replay's order up to the first that must still wait: one some
        other file still being written has not reached, not yet `grace` old."""
        files = [f for f in state.files.values() if f.reads]
        writing = [f for f in state.files.values() if self._writing(f, now)]
        heads: list[tuple[float, int, str, _File]] = [
            (*wall_order(f.head()), f.key, f) for f in files
        ]
        heapq.heapify(heads)
        out: list[Row] = []
        while heads:
            wall, step, _, file = heads[0]
            read = file.reads[0]
            row = read.rows[read.next]
            if now - read.at < self.grace and any(
                other is not file and _behind(other.last, (wall, step)) for other in writing
            ):
                break
            out.append(row)
            read.next += 1
            if read.next == len(read.rows):
                file.reads.popleft()
            if file.reads:
                heapq.heapreplace(heads, (*wall_order(file.head()), file.key, file))
            else:
                heapq.heappop(heads)
        if not heads:
            self._held.discard(run)
        return out


def _behind(last: tuple[float, int], key: tuple[float, int]) -> bool:
    """Whether a file whose last row read is at `last` may still write a row that comes
    before `key` in replay's order. One that has written `key`'s step has not: a file
    writes a step once, and its next step comes after every file's values of this one,
    so a step's rows leave together (MLflow stamps a step's metrics a few ms apart)."""
    return last < key and last[1] != key[1]
