"""`replay` reads a finished run's text logs too: a crash ends it as `run` would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from trainsentry.backtest.replay import replay_transitions
from trainsentry.sources.reading import iter_events, iter_points


def test_replay_pages_a_finished_runs_crash_and_ends_its_metric_alerts_as_crashed(
    tmp_path: Path,
) -> None:
    run = tmp_path / "exp1"
    run.mkdir()
    lines = [{"step": s, "loss": float("nan") if s == 5 else 1.0} for s in range(6)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with (run / "stderr.log").open("wb") as err:  # a real traceback from a real process
        subprocess.run([sys.executable, "-c", "import torch; torch.ones(2) @ torch.ones(3)"],
                       stderr=err, check=False)  # fmt: skip
    got = replay_transitions(iter_points([run]), order="input", events=iter_events([run]))
    assert [(t.rule, t.state) for t in got] == [
        ("loss_non_finite", "firing"),
        ("python_exception", "firing"),
        ("loss_non_finite", "resolved"),
        ("python_exception", "resolved"),
    ]
    cause = "run crashed: RuntimeError: inconsistent tensor size"
    assert got[2].reason is not None and got[2].reason.startswith(cause)
    assert got[3].reason == got[2].reason
    crash = got[1]
    assert crash.log is not None and crash.log["path"] == str(run / "stderr.log")
