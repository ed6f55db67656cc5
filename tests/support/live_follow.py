"""The live daemon in process, following a root while a real job writes into it.

Shared by the tests that compare live evaluation with replay: the daemon's own
loop cycles until the job exits, then sweeps once for what its last events left.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from trainsentry.alert import Transition
from trainsentry.point import Point, Row, points_of
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules
from trainsentry.runtime.loop import Daemon
from trainsentry.state.db import StateDB


def follow_job(
    root: Path, state: Path, start: Callable[[], subprocess.Popen[bytes]]
) -> tuple[subprocess.Popen[bytes], list[Point], list[Transition]]:
    """(the job `start()` began, the points the daemon read, the default pack's transitions)."""
    engine = Engine(load_rules())
    live: list[Transition] = []
    got: list[Point] = []

    def evaluate(run: str, rows: list[Row]) -> None:
        got.extend(points_of(run, rows))
        live.extend(engine.feed_rows(run, rows))

    daemon = Daemon([root], StateDB(state), [evaluate])
    daemon.start()
    job = start()
    try:
        while job.poll() is None:
            daemon.cycle(timeout=0.2)
        daemon.sweep()  # whatever the last events left unread
    finally:
        daemon.close()
    live.extend(engine.finish_all())
    return job, got, live
