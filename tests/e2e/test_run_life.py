"""The run's life through the real daemon: real probe-watched torch jobs that finish,
die of SIGKILL, raise, or hang, plain jobs without the probe that are killed, fail
or finish, and what the daemon says of each.

A job killed with SIGKILL writes nothing more: no traceback, no end record. On
the job's host the daemon sees its process gone (the probe's meta record names
pid and start time; without the probe, the process holding the run's files open
for writing) and pages the crash within seconds; a job whose probe closed, or
whose process exited 0, is finished, its alerts resolved "run finished" and its
silence never a page. The no-data rules are shortened by a rule file so the tests
need not wait minutes; every wait is on what the daemon wrote, with a generous
deadline.
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
PLAIN_JOB = str(SUPPORT / "plain_job.py")
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
    told = [a for a in alerts(out) if a["run"] == "clean" and a["rule"] != "loss_non_finite"]
    assert [a for a in told if a.get("family") != "pace"] == []  # its pace is the test box's
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


def plain_job(rundir: Path, end: str) -> subprocess.Popen[bytes]:
    """`python plain_job.py RUNDIR END >> RUNDIR/stdout.log`: no probe."""
    rundir.mkdir(exist_ok=True)
    with (rundir / "stdout.log").open("ab") as stdout:
        return subprocess.Popen([sys.executable, PLAIN_JOB, str(rundir), end], stdout=stdout)


def exit_statuses_known() -> bool:
    """Whether this user may listen to the kernel's process events (CAP_NET_ADMIN), as
    the daemon started by this test may."""
    from trainsentry.runtime.exits import ExitStatuses

    exits = ExitStatuses()
    try:
        return exits.listen()
    finally:
        exits.close()


def told_of(out: Path, run: str, pid: int) -> dict[str, object] | None:
    """The first alert that fired on `run` saying process `pid` ended."""
    return next(
        (
            a
            for a in alerts(out)
            if a["run"] == run and a["state"] == "firing" and f"process {pid} " in a["message"]
        ),
        None,
    )


@pytest.mark.skipif(sys.platform != "linux", reason="a job's writer is found in /proc")
@pytest.mark.timeout(300)
def test_plain_jobs_without_the_probe_are_watched_by_their_writer_and_told_in_seconds(
    tmp_path: Path,
) -> None:
    known = exit_statuses_known()  # else the kernel cannot say how a process ended
    daemon, out, address = start_daemon(tmp_path, quiet="120s", steps="120s")
    logs = tmp_path / "logs"
    # run → how its job ends: killed, killed mid-record, exit 3, exit 0, and a job of two
    # stages appending to one log (the first exits 0, the second is killed)
    ends = {"wait": "wait", "torn": "torn", "fail": "fail", "clean": "clean", "staged": "clean"}
    jobs = {run: plain_job(logs / run, end) for run, end in ends.items()}
    # a run whose writer cannot be seen: written, closed, and nobody holds it
    (logs / "unseen").mkdir()
    (logs / "unseen" / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    left: dict[str, float] = {}  # when each job was killed or told to stop
    ended = "finished" if known else "exited"  # a clean exit, as far as can be known
    stage2: subprocess.Popen[bytes] | None = None
    try:
        wait_until(
            lambda: all(
                (runs_of(address).get(run, {}).get("watched") or {}).get("pid") == job.pid
                for run, job in jobs.items()
            ),
            "every plain job watched by its process", timeout=60,
        )  # fmt: skip
        running, watching = runs_of(address), status_of(address)
        for run in ("fail", "clean", "staged", "torn"):
            (logs / run / "stop").touch()
            left[run] = time.time()
        torn = logs / "torn" / "metrics.jsonl"
        wait_until(lambda: not torn.read_bytes().endswith(b"\n"), "the torn job cut a record")
        for run in ("wait", "torn"):
            left[run] = time.time()
            os.kill(jobs[run].pid, signal.SIGKILL)
        for job in jobs.values():
            job.wait(timeout=30)
        wait_until(lambda: runs_of(address)["staged"]["state"] == ended, f"stage 1 {ended}")
        (logs / "staged" / "stop").unlink()
        stage2 = plain_job(logs / "staged", "wait")
        wait_until(
            lambda: (runs_of(address)["staged"].get("watched") or {}).get("pid") == stage2.pid,
            "the second stage watched",
        )
        restarted = runs_of(address)["staged"]
        left["stage2"] = time.time()
        stage2.kill()
        stage2.wait(timeout=30)
        told = {"wait": "process_exited" if known else "process_gone", "torn": "process_exited"}
        told["fail"] = told["wait"]
        pids = {run: job.pid for run, job in jobs.items()}
        for run in told:
            wait_until(lambda run=run: told_of(out, run, pids[run]), f"the {run} job told")
        wait_until(lambda: told_of(out, "staged", stage2.pid), "the second stage told")
        wait_until(lambda: runs_of(address)["clean"]["state"] == ended, f"the clean job {ended}")
        runs, status = runs_of(address), status_of(address)
    finally:
        for job in [*jobs.values(), *([stage2] if stage2 else [])]:
            if job.poll() is None:
                job.kill()
                job.wait()
        daemon.stop()
    host = socket.gethostname()
    for run, end in ends.items():
        watched = running[run]["watched"]
        assert watched["by"] == "writer" and watched["host"] == host
        assert watched["command"] == f"python plain_job.py {run} {end}"
        assert f"{run} [process {pids[run]}: python plain_job.py {run} {end}]" in watching
    assert running["unseen"]["watched"] is None and "unseen [" not in watching
    assert runs["unseen"]["state"] == "running"  # today's behaviour: quiet, in 120 s

    def said(run: str, pid: int, end: str, how: str) -> str:
        return f"process {pid} (python plain_job.py {run} {end}) on host {host} {how}"

    unknown = "is gone, its exit status unknown"
    how = {
        "wait": "was killed by SIGKILL" if known else unknown,
        "torn": "was killed by SIGKILL" if known else "is gone, its last line cut off",
        "fail": "exited with status 3" if known else unknown,
    }
    for run, rule in told.items():
        alert = told_of(out, run, pids[run])
        cause = said(run, pids[run], ends[run], how[run])
        assert alert is not None and alert["rule"] == rule
        assert alert["message"].startswith(cause)
        assert alert["severity"] == ("critical" if rule == "process_exited" else "warning")
        assert alert["log"]["path"] == str(logs / run / "metrics.jsonl")
        # within 10 s of the kill on a loaded machine: a look every 2 s, then a read
        assert alert["wall_time"] - left[run] < 10, (run, alert["wall_time"] - left[run])
        state = "crashed" if rule == "process_exited" else "exited"
        assert runs[run]["state"] == state and runs[run]["cause"] == cause
        assert runs[run]["watched"] is None  # its life ended: nothing left to watch
        assert f"{run} ({state}: {cause})" in status
    assert not [a for a in alerts(out) if a["run"] == "clean" and a["severity"] == "critical"]
    assert [a["rule"] for a in alerts(out) if a["run"] == "clean"] == (
        [] if known else ["process_gone"]
    )
    # the second stage: a new process writing the run its first stage ended, running again
    assert stage2 is not None and restarted["state"] == "running"
    second = told_of(out, "staged", stage2.pid)
    assert second is not None and second["rule"] == told["wait"]
    assert second["message"].startswith(said("staged", stage2.pid, "wait", how["wait"]))
    assert second["wall_time"] - left["stage2"] < 10
    assert not find(out, rule="run_stalled")
