"""A backtest predicts the daemon: live evaluation and replay of the same files agree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainsentry.point import Point
from trainsentry.reading import iter_points
from trainsentry.replay import replay_transitions
from trainsentry.rules.engine import Engine
from trainsentry.rules.lifecycle import Transition
from trainsentry.rules.loader import load_rules
from trainsentry.runtime import Daemon
from trainsentry.state import StateDB

HERE = Path(__file__).parent


def comparable(ts: list[Transition]) -> list[tuple]:
    return [(t.run, t.rule, t.metric, t.state, t.severity, t.step, t.message) for t in ts]


def test_live_run_and_replay_produce_the_same_transitions(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    engine = Engine(load_rules())
    live: list[Transition] = []
    got: list[Point] = []

    def evaluate(points: list[Point]) -> None:
        got.extend(points)
        live.extend(engine.feed_all(points))

    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [evaluate])
    daemon.start()
    job = subprocess.Popen(
        [sys.executable, str(HERE / "train_proc.py"), str(root / "run1"), "600", "200"],
        stdout=subprocess.DEVNULL,
    )
    try:
        while job.poll() is None:
            daemon.cycle(timeout=0.2)
        daemon.sweep()  # whatever the last events left unread
    finally:
        daemon.close()
    assert job.returncode == 0
    live.extend(engine.finish_all())

    replayed = replay_transitions(iter_points([root]), load_rules())
    # run ids differ by contract: live is relative to the root, replay to its parent
    assert {t.run for t in live} == {"run1"}
    assert {t.run for t in replayed} == {"logs/run1"}
    assert [t[1:] for t in comparable(live)] == [t[1:] for t in comparable(replayed)]
    fired = {t.rule for t in live if t.state == "firing"}
    assert {"loss_non_finite", "grad_norm_far_above_baseline"} <= fired
