"""The records that flow from sources to rules.

A decoder knows only its file, and a file's records share a step and a
stamp: a JSON line, a CSV row, a TensorBoard event of twenty scalars. So
decoders emit `Row`s (the step, the stamp, the tags and their values, in the
record's order) and the live path carries them as they are, one batch per
file read with the run beside it: the store, the silence clock and the
engine then pay per record, not per value, which is what a fleet of
1,000 runs x 20 series costs (19 of every 20 values are logged, not judged).

`Point` is one value with its run: what users and rule authors handle
(`dump`, `replay`, the engine's `feed`), and what evidence is rebuilt as.
`Sample` is a point without its run. All are tuples because millions are
made per second on a backfill and a tuple is the cheapest immutable record
CPython has; they are made with `tuple.__new__`, which skips NamedTuple's
Python-level `__new__`.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from trainsentry.jobs import member_of

_new = tuple.__new__

# The series a checkpoint root writes on its run (sources/checkpoints.py), which the rules
# tell from what the run logs (rules/checkpoints.py): a checkpoint is a file on disk,
# stamped with its completion, not a record the job logged. `checkpoint/step` is in the
# row of every complete checkpoint, at the step it holds.
CHECKPOINT_PREFIX = "checkpoint/"
CHECKPOINT_STEP = "checkpoint/step"


class Sample(NamedTuple):
    tag: str
    step: int
    wall_time: float
    value: float


class Point(NamedTuple):
    run: str
    tag: str
    step: int
    wall_time: float
    value: float

    def as_dict(self) -> dict[str, object]:
        """The point line of DESIGN.md (`dump --format jsonl`), with the run's job, rank
        and attempt where it is a rank or an attempt of one (jobs/identity.py)."""
        out: dict[str, object] = {
            "run": self.run,
            "tag": self.tag,
            "step": self.step,
            "wall_time": self.wall_time,
            "value": self.value,
        }
        member = member_of(self.run)
        if member.job != self.run:
            out.update(member.keys())
        return out


class Row(NamedTuple):
    """One record's values: `tags[i]` has `values[i]`, all at `step` and `wall_time`.

    `tags` is shared by every row of the same shape from one decoder (the
    keys of a JSON line, a CSV header, an event's template), so consumers
    cache what they decide per shape on it. A tag may appear twice (two
    values of one tag in one event): they are two points, in order.
    """

    step: int
    wall_time: float
    tags: tuple[str, ...]
    values: tuple[float, ...]


@dataclass(slots=True)
class TextEvent:
    """One event of a job's text log: a line, or the lines that say one thing together.

    A Python traceback from `Traceback (most recent call last):` to its exception
    line, an NCCL watchdog report, a structured record's message: what a pattern
    rule judges and what an alert quotes. Not a Point: text never enters the
    numeric path, so metrics cost what they cost without it. `line` is the
    1-based number of the event's first line in `path`; `level` is the record's
    level where the writer gave one ("error", "warning", ...), else "". `run`
    is set by the tailer (a decoder knows only its file). A "plain" event is many
    lines that need no more than their text, passed on together: its one item is
    their text, newlines between them, each line the "line" event it stands for
    (sources/text_scan.py).

    Not frozen, though nothing changes one once the tailer has placed it: one is
    built for every line of a text log that needs more than its text, twice
    (decoded, then placed), and a frozen dataclass is built at 0.7 µs against 0.15
    (bench/ingest_text.py).
    """

    path: str
    line: int
    wall_time: float
    lines: tuple[str, ...]
    kind: str = "line"  # "line" | "traceback" | "report" | "record" | "plain"
    level: str = ""
    run: str = ""
    # (index, character) of each line cut at MAX_LINE_CHARS: the character that followed
    # the cut, context for the pattern rules so that a cut never makes a match
    # (rules/pattern_set.py)
    cuts: tuple[tuple[int, str], ...] = ()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


# What a run was started with, by section ("params", "tags", "config", ...) and key:
# the values a person paged at 3 a.m. asks for first (which lr, which seed, which commit).
Trace = dict[str, dict[str, str]]


@dataclass(frozen=True, slots=True)
class RunEnd:
    """A tracker's word that a run ended: MLflow's run status, W&B's exit record.

    Not a text event: the tracker says it outright, so no rule has to read it
    from a line. `state` is a run life's ending (finished, crashed, cancelled),
    `wall` when it ended on the writer's clock (NaN when the tracker gave no
    time). `run` is set by the tailer where a decoder knows only its file.
    """

    state: str
    cause: str = ""
    wall: float = float("nan")
    run: str = ""


@dataclass(frozen=True, slots=True)
class ProbeMark:
    """A probe record about the run's process rather than a step: its meta record (who
    runs it, where) or its end record (it closed, cleanly or on an exception).

    What the run's life is judged from beside its text logs (rules/run_life.py).
    `pid_start` (clock ticks since boot) and `pid_ns` tell the process from a later
    one given the same pid; None where the probe could not know them.
    """

    kind: str  # "meta" | "end"
    path: str
    line: int
    wall_time: float
    step: int
    host: str = ""
    pid: int = 0
    pid_start: int | None = None
    pid_ns: str = ""
    exit: str = ""  # of an end record: "clean" | "exception"
    error: str = ""  # of an exception's end record: "RuntimeError: ..."
    run: str = ""


@contextmanager
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector held off while values are made one by one.

    A point or a row holds no container that could lead back to it, so it can be in
    no cycle; but each is a tuple, which the collector tracks, and a backfill's batch
    makes hundreds of thousands at once: the collections their number sets off would
    scan them (and everything kept alive beside them) again and again for nothing,
    three times the cost of making them (400,000 points of a W&B run: 0.33 s, 0.11 s
    held off). Used where many are made and nothing cyclic is."""
    held = gc.isenabled()
    if held:
        gc.disable()
    try:
        yield
    finally:
        if held:
            gc.enable()


def _single(rows: list[Row]) -> bool:
    """Whether every row holds one value (an event file's, most often): then its values
    are made without a zip a row, twice as fast."""
    return all(len(tags) == 1 == len(values) for _, _, tags, values in rows)


def samples_of(rows: Iterable[Row]) -> list[Sample]:
    """The rows' values one by one, in order."""
    rows = rows if isinstance(rows, list) else list(rows)
    with no_collection():
        if _single(rows):
            return [
                _new(Sample, (tags[0], step, wall, values[0])) for step, wall, tags, values in rows
            ]
        return [
            _new(Sample, (tag, step, wall, value))
            for step, wall, tags, values in rows
            for tag, value in zip(tags, values, strict=True)
        ]


def points_of(run: str, rows: Iterable[Row]) -> list[Point]:
    """The rows' values one by one with their run, in order."""
    rows = rows if isinstance(rows, list) else list(rows)
    with no_collection():
        if _single(rows):
            return [
                _new(Point, (run, tags[0], step, wall, values[0]))
                for step, wall, tags, values in rows
            ]
        return [
            _new(Point, (run, tag, step, wall, value))
            for step, wall, tags, values in rows
            for tag, value in zip(tags, values, strict=True)
        ]


def batches_of(points: Iterable[Point]) -> Iterator[tuple[str, list[Row]]]:
    """Points regrouped as the live path carries them: consecutive points of one run
    form a batch, and consecutive points of one step and stamp within it a row."""
    run: str | None = None
    rows: list[Row] = []
    key: tuple[int, float] | None = None
    tags: list[str] = []
    values: list[float] = []
    for p_run, tag, step, wall, value in points:
        if p_run != run or (step, wall) != key:
            if tags:
                assert key is not None
                rows.append(_new(Row, (key[0], key[1], tuple(tags), tuple(values))))
                tags, values = [], []
            if p_run != run:
                if run is not None:
                    yield run, rows
                run, rows = p_run, []
            key = (step, wall)
        tags.append(tag)
        values.append(value)
    if run is not None:
        assert key is not None
        rows.append(_new(Row, (key[0], key[1], tuple(tags), tuple(values))))
        yield run, rows
