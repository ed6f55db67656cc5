"""Looking at a job's process on its own host: real processes, started, killed, reaped."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from trainsentry.rules.run_life import RunProcess
from trainsentry.runtime.processes import ProcessCheck, alive, own_namespace, started_at

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def process_of(pid: int, start: int | None) -> RunProcess:
    return RunProcess(socket.gethostname(), pid, start, own_namespace(), "run/p.jsonl", 1)


def test_a_live_process_is_alive_and_a_later_one_of_the_same_pid_is_not() -> None:
    job = subprocess.Popen(SLEEPER)
    try:
        start = started_at(job.pid)
        assert start is not None
        assert alive(process_of(job.pid, start))
        assert not alive(process_of(job.pid, start - 1))  # the pid, reused by another
    finally:
        job.kill()
        job.wait()


def test_a_killed_process_is_gone_before_and_after_it_is_reaped() -> None:
    job = subprocess.Popen(SLEEPER)
    start = started_at(job.pid)
    os.kill(job.pid, signal.SIGKILL)
    try:
        # until its parent waits, a zombie: exited all the same
        os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)
        assert started_at(job.pid) is None
        assert not alive(process_of(job.pid, start))
    finally:
        job.wait()
    assert not alive(process_of(job.pid, start))


def test_a_process_gone_is_confirmed_only_by_a_second_look() -> None:
    job = subprocess.Popen(SLEEPER)
    live = [("runA", process_of(job.pid, started_at(job.pid)))]
    gone = [("runB", process_of(os.getpid(), -5))]  # this pid, another start: gone
    check = ProcessCheck()
    try:
        assert check.look(live + gone, now=0.0) == {"runB"}
        assert check.suspects and check.next_look > 0.0
        assert check.confirm(live + gone) == [("runB", "run/p.jsonl")]
        assert not check.suspects
        # an end record read between the looks: no longer watched, not confirmed
        check.look(gone, now=10.0)
        assert check.confirm([]) == []
    finally:
        job.kill()
        job.wait()


def test_one_process_writing_many_runs_is_looked_at_once_for_all_of_them() -> None:
    job = subprocess.Popen(SLEEPER)
    start = started_at(job.pid)
    assert start is not None
    sweep = [(f"run{i}", process_of(job.pid, start)) for i in range(50)]
    reused = [("old", process_of(job.pid, start - 1))]  # an earlier process of the same pid
    check = ProcessCheck()
    try:
        assert check.look(sweep + reused, now=0.0) == {"old"}
        assert check.confirm(sweep + reused) == [("old", "run/p.jsonl")]
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        assert check.look(sweep, now=10.0) == {f"run{i}" for i in range(50)}
        assert len(check.confirm(sweep)) == 50
    finally:
        job.kill()
        job.wait()


def test_only_a_process_of_this_host_and_pid_namespace_with_a_start_is_checkable() -> None:
    mine = process_of(1234, 99)
    assert mine.checkable(socket.gethostname(), own_namespace())
    assert not mine.checkable("another-host", own_namespace())
    assert not mine.checkable(socket.gethostname(), "pid:[1]")
    assert not process_of(1234, None).checkable(socket.gethostname(), own_namespace())
