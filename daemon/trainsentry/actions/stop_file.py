"""The stop file: how a rule asks a training job to end itself cleanly.

The daemon cannot (and should not) kill a job it only watches; the job can
cheaply check for a file. The file is `<run dir>/.trainsentry/STOP`: the
probe looks beside its own log file with no configuration, and any training
loop can check it with `trainsentry_probe.StopFile` (no torch needed). The
daemon never deletes the file, so a bare `os.path.exists` would also stop the
next run in that directory: a file older than the job's start is stale.

Where the daemon may not write to the log root (the systemd unit and the
container mount it read-only), `--control-dir DIR` moves the whole tree:
the file goes to `DIR/<run id>/.trainsentry/STOP`, and the job is pointed at
it with `TRAINSENTRY_STOP_FILE`. That is the one decision: the path below the
root is the same, only the root changes. Nothing falls back silently — a
stop file that cannot be written is reported in the alert's message.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trainsentry.alert import Transition, json_number
from trainsentry.sources.discover import CONTROL_DIR

STOP_NAME = "STOP"
STOP_FILE_ENV = "TRAINSENTRY_STOP_FILE"


def stop_file_path(run: str, run_dir: Path | None, control_dir: Path | None) -> Path:
    if control_dir is not None:
        parts = [p for p in run.split("/") if p not in ("", ".", "..")]
        return control_dir.joinpath(*parts, CONTROL_DIR, STOP_NAME)
    if run_dir is None:
        raise FileNotFoundError(f"the directory of run {run} is not known (deleted?)")
    return run_dir / CONTROL_DIR / STOP_NAME


def write_stop_file(path: Path, alert: Transition) -> Path:
    """JSON {rule, step, reason, ...}; written to a temp file and renamed (never half a file)."""
    content = {
        "rule": alert.rule,
        "step": alert.step,
        "reason": alert.message,
        "run": alert.run,
        "severity": alert.severity,
        "metric": alert.metric,
        "value": json_number(alert.value),
        "written_at": time.time(),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{STOP_NAME}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(content, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
