"""A job's attempts and its last good checkpoint, as `status` and /api/runs show them, from
a real daemon watching a plain job that crashes, resumes, and is requeued by Slurm.

The job (support/resuming_job.py) appends to one metrics file and saves HF-style
`checkpoint-<N>/` folders beside it, every 10 steps. Its first attempt crashes at step
25, leaving a save without its last file; the second resumes from step 20 (its step goes
back: an attempt) and stops at its save of step 40; Slurm's requeue line then says the
job runs again, and the third resumes after step 40, where it had logged last: only the
line makes it an attempt. It crashes at step 50, half-way through its next save, so the
last good checkpoint is step 50's, not the folder of step 60 after it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import pytest
from support.alert_log import find, status_of
from support.daemon_process import DaemonProcess
from support.paths import SUPPORT
from support.ports import free_port
from support.waiting import wait_until

from trainsentry.rules.attempts import LAST_WORDS_SECONDS

JOB = str(SUPPORT / "resuming_job.py")
REQUEUE = (
    "slurmstepd: error: *** JOB 4242 ON gpu-node-07 CANCELLED AT 2026-03-01T10:00:00"
    " DUE TO JOB REQUEUE ***\n"
)


def attempt(rundir: Path, until: int, *end: str) -> int:
    """One attempt of the job, to its end: its exit status."""
    with (rundir / "stdout.log").open("ab") as out:
        return subprocess.run(
            [sys.executable, JOB, str(rundir), str(until), *end],
            stdout=out, stderr=subprocess.STDOUT, timeout=120,
        ).returncode  # fmt: skip


def job_of(address: str, run: str = "job") -> dict[str, Any]:
    with urlopen(f"http://{address}/api/runs", timeout=10) as answer:
        return next((r for r in json.load(answer)["runs"] if r["run"] == run), {})


@pytest.mark.timeout(300)  # three short attempts and Slurm's 30 s of last words
def test_status_shows_a_jobs_attempts_and_its_last_good_checkpoint(tmp_path: Path) -> None:
    logs, out, address = tmp_path / "logs", tmp_path / "alerts.jsonl", f"127.0.0.1:{free_port()}"
    rundir = logs / "job"
    rundir.mkdir(parents=True)
    daemon = DaemonProcess(
        str(logs), "--state-dir", str(tmp_path / "state"), "--http", address,
        "--alerts-jsonl", str(out), merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        assert attempt(rundir, 25, "crash") == 1
        wait_until(
            lambda: (job_of(address).get("checkpoint") or {}).get("step") == 20,
            "the first attempt read to its save of step 20",
        )
        first = job_of(address)
        assert attempt(rundir, 40) == 0
        wait_until(
            lambda: (job_of(address).get("checkpoint") or {}).get("step") == 40,
            "the second attempt read to its save of step 40",
        )
        second = job_of(address)
        with (rundir / "slurm-4242.out").open("a") as slurm:
            slurm.write(REQUEUE)
        wait_until(lambda: find(out, run="job", rule="slurm_requeued"), "the requeue read")
        time.sleep(LAST_WORDS_SECONDS + 1)  # Slurm's KillWait: the requeued job starts after
        assert attempt(rundir, 50, "crash") == 1
        wait_until(
            lambda: (job_of(address).get("checkpoint") or {}).get("step") == 50,
            "the third attempt read to its save of step 50",
        )
        third, status = job_of(address), status_of(address)
    finally:
        daemon.stop()
    assert first["attempts"] == {"count": 1, "current": 1}
    assert first["checkpoint"]["path"] == str(rundir / "checkpoint-20")
    assert second["attempts"] == {"count": 2, "current": 2}
    assert third["attempts"] == {"count": 3, "current": 3}
    saved = rundir / "checkpoint-50"
    completed = max(os.stat(p).st_mtime for p in [saved, *saved.iterdir()])
    assert third["checkpoint"]["path"] == str(saved)
    assert third["checkpoint"]["wall_time"] == pytest.approx(completed)
    assert (rundir / "checkpoint-60").is_dir()  # half-written: no good checkpoint
    assert "job [attempt 3 of 3]" in status
    assert "job: last good checkpoint step 50, " in status and f"ago: {saved}\n" in status
    restarted = find(out, run="job", rule="job_restarted")
    assert restarted is not None
    # the run written again after its requeue ended its life: its restart still stands
    assert find(out, run="job", rule="slurm_requeued", state="resolved") is not None
    assert find(out, run="job", rule="job_restarted", state="resolved") is None
    assert (
        "attempt 2 resumed at step 21; the attempt before got to step 25" in (restarted["message"])
    )


def test_checkpoints_named_as_the_config_says_are_a_jobs_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    """`checkpoint_names` in the daemon's config: a job's own `weights-<step>.bin`."""
    logs, address = tmp_path / "logs", f"127.0.0.1:{free_port()}"
    config = tmp_path / "trainsentry.yaml"
    config.write_text('checkpoint_names: ["weights-{step}.bin"]\n')
    rundir = logs / "custom"
    rundir.mkdir(parents=True)
    daemon = DaemonProcess(
        str(logs), "--config", str(config), "--state-dir", str(tmp_path / "state"),
        "--http", address, merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        saved = time.time() - 3600  # long settled
        for step in (10, 20):
            (rundir / f"weights-{step}.bin").write_bytes(b"w" * 100)
            os.utime(rundir / f"weights-{step}.bin", (saved + step, saved + step))
        lines = (json.dumps({"step": s, "time": time.time(), "loss": 1.0}) for s in range(25))
        (rundir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
        wait_until(
            lambda: (job_of(address, "custom").get("checkpoint") or {}).get("step") == 20,
            "the job's own checkpoint names read",
        )
        found = job_of(address, "custom")["checkpoint"]
    finally:
        daemon.stop()
    assert found["path"] == str(rundir / "weights-20.bin")
    assert found["wall_time"] == pytest.approx(saved + 20)
