"""Reading finished runs from start to end: the input of `dump` and `replay`.

The same FileTail as the live daemon, with no state kept, so a backtest reads
exactly what the daemon would have read.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trainsentry.point import Point, ProbeMark, Row, RunEnd, TextEvent
from trainsentry.sources.discover import LogFile, roots
from trainsentry.sources.following import follow
from trainsentry.sources.survey import nothing_readable, readable
from trainsentry.sources.tail import FileTail, TailRead

TRACKER_KINDS = ("wandb", "mlflow_db", "mlflow_run")  # the logs that say how their runs ended


def iter_batches(
    paths: Iterable[str | Path],
    on_error: Callable[[str], None] | None = None,
    on_empty: Callable[[str], None] | None = None,
    on_busy: Callable[[str], None] | None = None,
) -> Iterator[list[Point]]:
    """Batches of points, file by file in sorted order, each file to its end.

    Raises FileNotFoundError for a path that does not exist: a typo on the
    command line deserves a clear error, not an empty result.
    """
    for log in _logs(paths, on_empty):
        yield from _read(log, on_error, on_busy)


def iter_files(
    paths: Iterable[str | Path],
    on_error: Callable[[str], None] | None = None,
    on_empty: Callable[[str], None] | None = None,
    on_busy: Callable[[str], None] | None = None,
    marks: list[ProbeMark] | None = None,
) -> Iterator[list[Point]]:
    """Each file's points in file order, file by file in sorted order; the probe's meta
    and end records into `marks` as their files are read."""
    for log in _logs(paths, on_empty):
        yield [p for batch in _read(log, on_error, on_busy, marks) for p in batch]


def wall_order(point: Point | Row) -> tuple[float, int]:
    """A point's or row's place on the wall clock; one with no usable time goes last.
    Within one stamp, by step: MLflow stamps in milliseconds, and two steps logged
    within one keep their steps apart (a step is one moment), whichever file each value
    is in. The live loop merges a run's files in this order too (runtime/run_merge.py)."""
    wall = point.wall_time
    return (wall if math.isfinite(wall) else math.inf, point.step)


def iter_points(
    paths: Iterable[str | Path],
    on_error: Callable[[str], None] | None = None,
    on_empty: Callable[[str], None] | None = None,
    on_busy: Callable[[str], None] | None = None,
    marks: list[ProbeMark] | None = None,
) -> Iterator[Point]:
    """The points in the order a live daemon judges them.

    Live, a run's files (Keras' train/ and validation/ writers, a resumed
    run's second event file) are read interleaved as they are written, and
    each file in its own order. So the files are merged by wall time, each kept
    in file order: heapq.merge keeps each input's order even where its times
    are not sorted (a clock stepped back), so one file is fed exactly as live
    reads it, where sorting every point would reorder it.
    """
    files = iter_files(paths, on_error, on_empty, on_busy, marks)
    yield from heapq.merge(*files, key=wall_order)


def _logs(
    paths: Iterable[str | Path], on_empty: Callable[[str], None] | None = None
) -> Iterator[LogFile]:
    """The logs under each path; `on_empty` is told of a path that holds none it can read."""
    given = list(paths)
    for raw in given:
        if not Path(raw).exists():
            raise FileNotFoundError(f"no such file or directory: {raw}")
    for root in roots(given, replay=True):
        found = root.scan()
        logs = readable(found)
        if not logs and on_empty is not None:
            on_empty(nothing_readable(root.top, found))
        yield from logs


def iter_events(
    paths: Iterable[str | Path], on_error: Callable[[str], None] | None = None
) -> Iterator[TextEvent]:
    """The text logs' events, file by file in sorted order (their metrics come from
    iter_points): what `replay` feeds the pattern rules once a run's points are in."""
    for log in _logs(paths):
        if log.kind == "text":
            for got in _reads(log, on_error):
                yield from got.events


def iter_ends(paths: Iterable[str | Path]) -> Iterator[RunEnd]:
    """What the trackers' stores say of how their runs ended (MLflow's run status, W&B's
    exit record): what `replay` ends those runs with, after their points and events."""
    for log in _logs(paths):
        if log.kind in TRACKER_KINDS:
            for got in _reads(log, None):
                yield from got.ends


def _read(
    log: LogFile,
    on_error: Callable[[str], None] | None,
    on_busy: Callable[[str], None] | None = None,
    marks: list[ProbeMark] | None = None,
) -> Iterator[list[Point]]:
    for got in _reads(log, on_error, on_busy):
        if marks is not None:
            marks.extend(got.marks)
        points = got.points  # made anew at each look
        if points:
            yield points


def _reads(
    log: LogFile,
    on_error: Callable[[str], None] | None,
    on_busy: Callable[[str], None] | None = None,
) -> Iterator[TailRead]:
    """The file's reads from its start to its end, errors told to `on_error`; a log a
    writer holds locked now (nothing skipped, nothing read), and a bound reached, to
    `on_busy`, or else `on_error`."""
    tail = follow(log)
    try:
        while True:
            got = tail.read()
            if on_error is not None:
                for err in got.errors:
                    on_error(err)
                if got.unreadable:
                    on_error(f"{tail.path}: {got.unreadable}")
            told = on_busy or on_error
            if got.busy and told is not None:
                told(f"{tail.path}: {got.busy}")
            if told is not None:  # a bound reached (checkpoints.py): said, nothing skipped
                for note in got.notes:
                    told(note)
            if not got.more and isinstance(tail, FileTail):
                got.events.extend(tail.let_go())  # a finished log: nothing will continue it
            yield got
            if not got.more:
                break
    finally:
        tail.close()
