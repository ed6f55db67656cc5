"""A backtest predicts the daemon: live evaluation and replay of the same files agree."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from support.daemon_process import live_alerts, replayed_alerts
from support.live_follow import follow_job
from support.paths import SUPPORT

from trainsentry.alert import Transition
from trainsentry.backtest.replay import replay_transitions
from trainsentry.rules.loader import load_rules
from trainsentry.sources.reading import iter_points


def comparable(ts: list[Transition]) -> list[tuple]:
    return [(t.run, t.rule, t.metric, t.state, t.severity, t.step, t.message) for t in ts]


def test_live_run_and_replay_produce_the_same_transitions(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    job, _, live = follow_job(
        root,
        tmp_path / "state.db",
        lambda: subprocess.Popen(
            [sys.executable, str(SUPPORT / "train_proc.py"), str(root / "run1"), "600", "200"],
            stdout=subprocess.DEVNULL,
        ),
    )
    assert job.returncode == 0

    replayed = replay_transitions(iter_points([root]), load_rules(), order="input")
    # run ids differ by contract: live is relative to the root, replay to its parent
    assert {t.run for t in live} == {"run1"}
    assert {t.run for t in replayed} == {"logs/run1"}
    assert [t[1:] for t in comparable(live)] == [t[1:] for t in comparable(replayed)]
    fired = {t.rule for t in live if t.state == "firing"}
    assert {"loss_non_finite", "grad_norm_far_above_baseline"} <= fired


def test_replay_feeds_a_file_with_a_skewed_clock_in_file_order_as_live_does(
    tmp_path: Path,
) -> None:
    """Steps 60-69 carry timestamps 30 s early (a clock stepped back): live reads file order."""
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    start = time.time() - 200
    with (run / "metrics.jsonl").open("w") as f:
        for step in range(100):
            skew = 30 if 60 <= step < 70 else 0
            loss = float("nan") if 65 <= step < 68 else 2.0 - step / 100
            f.write(json.dumps({"step": step, "time": start + step - skew, "loss": loss}) + "\n")
    live = live_alerts(
        tmp_path / "alerts.jsonl", str(tmp_path / "logs"), "--state-dir", str(tmp_path / "s")
    )
    replayed = replayed_alerts(str(tmp_path / "logs"))
    assert ("firing", 65) in [(t["state"], t["step"]) for t in live]
    keys = ("rule", "state", "step", "message")
    assert [[t[k] for k in keys] for t in replayed] == [[t[k] for k in keys] for t in live]


def test_replay_interleaves_a_runs_files_by_wall_time_each_in_its_own_order(
    tmp_path: Path,
) -> None:
    run = tmp_path / "exp"
    for split, times in (("train", [0, 2, 9, 4]), ("validation", [1, 3, 5])):
        (run / split).mkdir(parents=True)
        rows = [{"step": i, "time": 1795000000 + t, "loss": 1.0} for i, t in enumerate(times)]
        (run / split / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    order = [(p.tag.split("/")[0], p.step) for p in iter_points([run])]
    assert order == [
        ("train", 0),
        ("validation", 0),
        ("train", 1),
        ("validation", 1),
        ("validation", 2),
        ("train", 2),
        ("train", 3),
    ]
