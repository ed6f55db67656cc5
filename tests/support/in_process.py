"""Driving the daemon's loop in the test's own process: JSONL points written, cycles turned."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trainsentry.point import Point, points_of
from trainsentry.runtime.loop import Daemon, RowSink
from trainsentry.runtime.restart import Memory
from trainsentry.state.db import StateDB


def into(got: list[Point]) -> RowSink:
    """A daemon sink that keeps the points it is handed, one by one."""
    return lambda run, rows: got.extend(points_of(run, rows))


def write_points(path: Path, steps: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for step in steps:
            f.write(json.dumps({"step": step, "loss": 1.0 / (step + 1)}) + "\n")


def read_until(daemon: Daemon, got: list[Point], count: int, cycles: int = 60) -> None:
    """Turn the loop until `count` points arrived (or `cycles` of at most 0.1 s each)."""
    for _ in range(cycles):
        if len(got) >= count:
            return
        daemon.cycle(timeout=0.1)


@contextmanager
def following(
    root: Path, state_dir: Path, memory: Memory | None = None
) -> Iterator[tuple[Daemon, list[Point]]]:
    """A daemon on `root`, started, and the points it delivers; closed at the end.

    With `memory`, snapshots of it are taken only when a test makes one due.
    """
    got: list[Point] = []
    daemon = Daemon(
        [root], StateDB(state_dir / "state.db"), [into(got)], memory=memory, snapshot_every=3600
    )
    daemon.start()
    try:
        yield daemon, got
    finally:
        daemon.close()
