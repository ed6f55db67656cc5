"""The run's life through the real daemon: real probe-watched torch jobs that finish,
die of SIGKILL, raise, or hang, and what the daemon says of each.

A job killed with SIGKILL writes nothing more: no traceback, no end record. On
the job's host the daemon sees its process gone (the probe's meta record names
pid and start time) and pages the crash within seconds; a job whose probe
closed is finished, its alerts resolved "run finished" and its silence never a
page. The no-data rules are shortened by a rule file so the tests need not wait
minutes; every wait is on what the daemon wrote, with a generous deadline.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.alert_log import alerts, find, status_of
from support.daemon_process import DaemonProcess
from support.paths import SUPPORT
from support.ports import free_port
from support.waiting import wait_until

JOB = str(SUPPORT / "probe_job.py")
# the pack's silences, shortened: seconds instead of minutes (run_stalled's well over
# the few seconds a crash takes to be seen, as 15 min are over them in the pack)
SHORT = """
rules:
  - name: run_stalled
    severity: warning
    family: liveness
    no_data: {{factor: 20, min_silence: {quiet}}}
  - name: probe_steps_stopped
    tag: probe/step_time
    severity: warning
    family: liveness
    no_data: {{factor: 10, min_silence: {steps}}}
"""


def start_daemon(
    tmp_path: Path, quiet: str = "15s", steps: str = "3s"
) -> tuple[DaemonProcess, Path, str]:
    """The daemon with the pack's silences shortened to `quiet` (run_stalled) and
    `steps` (probe_steps_stopped)."""
    (tmp_path / "logs").mkdir()
    rules = tmp_path / "short.yaml"
    rules.write_text(SHORT.format(quiet=quiet, steps=steps))
    out, address = tmp_path / "alerts.jsonl", f"127.0.0.1:{free_port()}"
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--state-dir", str(tmp_path / "state"), "--http", address,
        "--rules", "default", str(rules), "--alerts-jsonl", str(out), merge_stderr=True,
    )  # fmt: skip
    daemon.wait_for_text("caught up")
    return daemon, out, address


def job(logdir: Path, mode: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, JOB, str(logdir), mode],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def runs_of(address: str) -> dict[str, dict[str, object]]:
    """The runs of /api/runs by name."""
    from urllib.request import urlopen

    with urlopen(f"http://{address}/api/runs", timeout=10) as answer:
        return {r["run"]: r for r in json.load(answer)["runs"]}


@pytest.mark.timeout(400)  # two jobs and a 25 s silence, on a machine that may be loaded
def test_a_sigkilled_job_is_paged_as_a_crash_and_a_clean_exit_is_finished_with_no_page(
    tmp_path: Path,
) -> None:
    # silences far longer than the few seconds a gone process takes to be seen, even on
    # a loaded machine: the crash must be told as a crash, not raced by "went quiet"
    daemon, out, address = start_daemon(tmp_path, quiet="25s", steps="120s")
    logs = tmp_path / "logs"
    killed = job(logs / "killed", "forever")
    try:
        assert job(logs / "clean", "finish").wait(timeout=120) == 0
        wait_until(
            lambda: find(out, run="killed", rule="loss_non_finite", state="firing"),
            "the killed job's NaN paged (its meta record read)", timeout=120,
        )  # fmt: skip
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        wait_until(
            lambda: find(out, run="killed", rule="process_exited", state="firing"),
            "the SIGKILLed job paged as a crash",
        )
        wait_until(
            lambda: find(out, run="clean", rule="loss_non_finite", state="resolved"),
            "the finished job's NaN resolved",
        )
        # a run without the probe that stops writing goes quiet after 25 s: by then the
        # finished and the crashed runs would have gone quiet too, were they judged so
        quiet = logs / "quiet" / "metrics.jsonl"
        quiet.parent.mkdir()
        now = time.time()
        quiet.write_text(
            "".join(json.dumps({"step": i, "time": now - 1 + i / 10, "loss": 1.0}) + "\n"
                    for i in range(10))
        )  # fmt: skip
        wait_until(
            lambda: find(out, run="quiet", rule="run_stalled", state="firing"),
            "the control run went quiet", timeout=120,
        )  # fmt: skip
        status, runs = status_of(address), runs_of(address)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
        daemon.stop()
    host = socket.gethostname()
    crash = find(out, run="killed", rule="process_exited", state="firing")
    assert crash is not None and crash["severity"] == "critical"
    cause = f"process {killed.pid} on host {host} exited without an end record"
    assert crash["message"].startswith(cause)
    assert crash["log"]["path"] == str(logs / "killed" / "trainsentry-probe.jsonl")
    nan = find(out, run="killed", rule="loss_non_finite", state="resolved")
    assert nan is not None and nan["reason"] == f"run crashed: {cause}"
    finished = find(out, run="clean", rule="loss_non_finite", state="resolved")
    assert finished is not None and finished["reason"] == "run finished"
    assert [a for a in alerts(out) if a["run"] == "clean" and a["rule"] != "loss_non_finite"] == []
    assert not find(out, run="killed", rule="run_stalled")
    assert f"killed (crashed: {cause})" in status
    assert "clean (finished)" in status
    assert runs["killed"]["state"] == "crashed" and runs["clean"]["state"] == "finished"


def test_a_job_that_raises_is_crashed_by_its_probe_end_record(tmp_path: Path) -> None:
    daemon, out, address = start_daemon(tmp_path)
    try:
        assert job(tmp_path / "logs" / "raised", "raise").wait(timeout=120) == 1
        wait_until(
            lambda: find(out, rule="probe_ended_by_exception", state="firing"),
            "the exception's end record paged",
        )
        runs = runs_of(address)
    finally:
        daemon.stop()
    page = find(out, rule="probe_ended_by_exception", state="firing")
    assert page is not None
    assert "RuntimeError: the data shard went missing at step 20" in page["message"]
    assert runs["raised"]["state"] == "crashed"
    assert runs["raised"]["cause"] == "RuntimeError: the data shard went missing at step 20"
    assert not find(out, rule="process_exited")  # the end record came: no second page


def test_a_probe_loop_whose_steps_stop_while_it_lives_is_stalled_then_runs_on(
    tmp_path: Path,
) -> None:
    daemon, out, address = start_daemon(tmp_path)
    run = tmp_path / "logs" / "hung"
    hung = job(run, "hang")
    try:
        wait_until(
            lambda: find(out, rule="probe_steps_stopped", state="firing"),
            "the hung loop warned", timeout=120,
        )  # fmt: skip
        stalled = runs_of(address)["hung"]
        assert hung.poll() is None  # it lives: stalled, not crashed
        (run / "go").touch()
        assert hung.wait(timeout=120) == 0
        wait_until(
            lambda: runs_of(address).get("hung", {}).get("state") == "finished",
            "the resumed job finished",
        )
    finally:
        if hung.poll() is None:
            hung.kill()
            hung.wait()
        daemon.stop()
    assert stalled["state"] == "stalled"
    warning = find(out, rule="probe_steps_stopped", state="firing")
    assert warning is not None and warning["severity"] == "warning"
    # step 19 was the last taken; its row waits for late values until the next step
    # begins (probe.py), so the last step written before the hang is 18
    assert "after step 18" in warning["message"]
    resolved = find(out, rule="probe_steps_stopped", state="resolved")
    assert resolved is not None and resolved["reason"] == "data resumed"
    assert not find(out, rule="process_exited")
