"""`trainsentry demo` tells its story to the end: warning, critical, projection, NaN, lead time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_demo(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", "demo", "--fast", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_demo_warns_pages_with_a_projection_and_gives_the_lead_time(tmp_path: Path) -> None:
    got = run_demo(tmp=tmp_path)
    assert got.returncode == 0, got.stdout + got.stderr
    out = got.stdout
    assert "FIRING    warning  grad_norm_exponential_growth [train/grad_norm]" in out
    assert "ESCALATED critical grad_norm_exponential_growth" in out
    assert "projected to pass 100 in ~" in out
    assert "FIRING    critical loss_non_finite [train/loss]" in out
    assert "train/loss is nan (the job is lost)" in out
    lead = next(line for line in out.splitlines() if "lead time:" in line)
    steps = int(lead.split("lead time:")[1].split()[0])
    assert steps > 0 and "between the first critical alert and the NaN" in lead
    assert "would notify: nothing configured" in out
    assert got.stderr == ""


def test_the_demo_cleans_up_its_temporary_directory(tmp_path: Path) -> None:
    assert run_demo(tmp=tmp_path).returncode == 0
    assert list(tmp_path.iterdir()) == []


def test_kept_logs_replay_to_the_same_critical(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    got = run_demo("--keep", str(keep), "--notify", "slack://T000/B000/secret", tmp=tmp_path)
    assert got.returncode == 0
    assert "would notify: slack://… " in got.stdout and "T000" not in got.stdout
    replay = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", str(keep / "logs")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "ESCALATED critical grad_norm_exponential_growth" in replay.stdout
