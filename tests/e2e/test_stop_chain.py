"""The whole loop: a probed job misbehaves, a critical rule writes STOP, the job stops itself."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from support.paths import SUPPORT

RULES = """\
rules:
  - name: grad_norm_ceiling
    metric: grad_norm
    severity: critical
    threshold: {above: 20}
    actions: [stop]
"""


def test_a_critical_rule_stops_a_probed_job_through_its_stop_file(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    run = logs / "job"
    run.mkdir(parents=True)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    state = tmp_path / "state"
    command = ["run", str(logs), "--rules", str(rules), "--state-dir", str(state), "--http", "off"]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "trainsentry", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert daemon.stdout is not None
        daemon.stdout.readline()  # "watching ..." once it has started
        job = subprocess.run(
            [sys.executable, str(SUPPORT / "stop_job.py"), str(run), "200000"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=30)
    assert job.returncode == 0, job.stderr
    assert job.stdout.startswith("stopped at step"), job.stdout + job.stderr
    stop = json.loads((run / ".trainsentry" / "STOP").read_text())
    assert stop["rule"] == "grad_norm_ceiling"
    stopped_at = int(job.stdout.split()[-1])
    assert stop["step"] <= stopped_at
    assert (run / "checkpoint.pt").exists()
    assert "grad_norm_ceiling" in out
