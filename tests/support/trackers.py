"""Tracker stores written by the real MLflow and W&B packages (once a session: conftest).

Each kind is written by its own process of `tracker_jobs.py` (MLflow's and
W&B's imports and wandb-core's service stay out of the test process), all
kinds at once, so a module pays for the slowest, not the sum.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.paths import SUPPORT

KINDS = ("mlflow-sqlite", "mlflow-files", "wandb")
JOB = SUPPORT / "tracker_jobs.py"


def job_env() -> dict[str, str]:
    """No network, nothing written to the user's home."""
    env = dict(os.environ)
    env.update(WANDB_MODE="offline", WANDB_SILENT="true", MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="0")
    return env


def start_job(kind: str, directory: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(JOB), kind, str(directory), *args],
        cwd=directory.parent,
        env=job_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def write_all(
    base: Path, kinds: tuple[str, ...] = KINDS, args: tuple[str, ...] = ()
) -> dict[str, Path]:
    """Each kind's store under base/<kind>, written by the real package (`args`:
    tracker_jobs.py's STEPS, DIVERGE_AT, JUMP_AT)."""
    base.mkdir(parents=True, exist_ok=True)
    jobs = {kind: start_job(kind, base / kind, *args) for kind in kinds}
    for kind, job in jobs.items():
        _, err = job.communicate(timeout=300)
        assert job.returncode == 0, f"{kind}: {err.decode(errors='replace')[-2000:]}"
    return {kind: base / kind for kind in kinds}


def expected(directory: Path) -> Any:
    return json.loads((directory / "expected.json").read_text())


def mlflow_points(directory: Path, store: str) -> list[tuple[str, str, int, float, float]]:
    """MlflowClient's metric history as trainsentry's points (run id as sources.md says)."""
    out = []
    for m in expected(directory):
        run = f"{store}/{m['experiment']}/{m['run_name']}-{m['run_id'][:8]}"
        out.append((run, m["tag"], m["step"], m["wall_time"], m["value"]))
    return sorted(out)
