"""`trainsentry demo` tells its story to the end: warning, critical, projection, NaN, lead time."""

from __future__ import annotations

import os
import re
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


def test_on_an_80_column_terminal_no_line_breaks_inside_a_field(tmp_path: Path) -> None:
    """Heads keep "step N" whole, progress lines fit, and long lines hang after their label."""
    from support.pty_process import PtyProcess, plain

    term = PtyProcess("demo", "--fast", env={"TMPDIR": str(tmp_path)}, columns=80)
    assert term.wait() == 0
    lines = [x.rstrip() for x in plain(term.output).replace("\r\n", "\n").splitlines()]
    assert [x for x in lines if len(x) > 80] == []
    numbers = [b.split()[0].isdigit() if b.split() else False for b in lines[1:]]
    cut = [a for a, n in zip(lines, numbers, strict=False) if a.endswith(" step") and n]
    assert cut == []
    progress = [x for x in lines if re.match(r"\[\s*[\d.]+s\] step ", x)]
    assert progress and all("so far" in x or "no alerts yet" in x for x in progress)
    heads = [
        i for i, x in enumerate(lines) if "grad_norm_exponential_growth" in x and "FIRING" in x
    ]
    assert heads and "train/grad_norm  step " in lines[heads[0] + 1]  # its own line, whole
    lead = next(i for i, x in enumerate(lines) if "lead time:" in x)
    assert lines[lead + 1].startswith(" " * len("  lead time: "))  # hanging, not at column 0
