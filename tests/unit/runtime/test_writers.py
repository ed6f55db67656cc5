"""Finding the process that writes a run's files without the probe, and how it ended:
real processes holding real files, killed, exiting, forking, behind tee."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

from trainsentry.rules.run_life import WRITER, Ending, RunProcess
from trainsentry.runtime.exits import ExitStatuses, KernelLog, oom_kills
from trainsentry.runtime.processes import own_namespace, started_at, zombie_exit
from trainsentry.runtime.writers import (
    RECENT_SECONDS,
    RESCAN_SECONDS,
    WriterWatch,
    command_of,
    judge,
    scan,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")

# opens argv[1] with mode argv[2] (or stdout's file, "-"), says so, waits for stdin to end
HOLDER = """
import sys
f = open(sys.argv[1], sys.argv[2]) if sys.argv[1] != "-" else sys.stdout
print("ready", file=sys.stderr, flush=True)
sys.stdin.read()
"""


def hold(path: Path, mode: str, **kw: object) -> subprocess.Popen[bytes]:
    """A process holding `path` open with `mode` until its stdin closes."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path), mode],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,  # type: ignore[call-overload]
    )
    assert child.stderr is not None and child.stderr.readline().strip() == b"ready"
    return child


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()


def looked(path: Path) -> dict[str, str]:
    return {str(path): os.path.realpath(path)}


def test_a_process_holding_the_file_for_writing_is_its_writer_and_a_reader_is_not(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("")
    children.append(reader := hold(log, "r"))
    assert scan(looked(log)) == {}  # read-only: no writer
    children.append(appender := hold(log, "a"))
    children.append(updater := hold(tmp_path / "other.jsonl", "w+"))
    found = scan({**looked(log), **looked(tmp_path / "other.jsonl")})
    assert found[str(log)].pid == appender.pid != reader.pid
    assert found[str(log)].start == started_at(appender.pid)
    assert found[str(log)].command.startswith(os.path.basename(sys.executable) + " -c")
    assert found[str(tmp_path / "other.jsonl")].pid == updater.pid  # O_RDWR writes too


def test_stdout_redirected_to_the_file_is_a_writer_and_the_oldest_of_a_fork_is_chosen(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    # `python train.py > stdout.log` whose DataLoader forks workers holding the same file
    log = tmp_path / "stdout.log"
    forker = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n    time.sleep(60)\n"
        "print('ready', file=sys.stderr, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with log.open("w") as out:
        job = subprocess.Popen(
            [sys.executable, "-c", forker],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.PIPE,
        )  # fmt: skip
    children.append(job)
    assert job.stderr is not None and job.stderr.readline().strip() == b"ready"
    worker = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _parent(int(p)) == job.pid)
    try:
        assert scan(looked(log))[str(log)].pid == job.pid  # not its worker
    finally:
        os.kill(worker, signal.SIGKILL)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_log_written_through_tee_is_the_job_behind_tee(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "train.log"
    job = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; print('step 1', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE,
    )
    children.append(job)
    assert job.stdout is not None
    tee = subprocess.Popen(["tee", str(log)], stdin=job.stdout, stdout=subprocess.DEVNULL)
    job.stdout.close()  # the job and tee hold the pipe's ends, this process neither
    children.append(tee)
    deadline = time.monotonic() + 10
    while not (log.exists() and log.stat().st_size) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = scan(looked(log))[str(log)]
    assert found.pid == job.pid and found.command.startswith("python -c import sys")


def test_a_command_is_shortened_and_cannot_break_the_line_it_goes_in() -> None:
    mine = command_of(os.getpid())
    assert mine and "(" not in mine and len(mine) <= 60
    assert command_of(2**22 + 7) == "?"  # no such process


def test_a_zombie_still_says_its_exit_status(children: list[subprocess.Popen[bytes]]) -> None:
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    children += [killed, failed]
    starts = {p.pid: started_at(p.pid) for p in (killed, failed)}
    os.kill(killed.pid, signal.SIGKILL)
    for p in (killed, failed):  # exited, not reaped: zombies
        os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    assert zombie_exit(killed.pid, starts[killed.pid]) == signal.SIGKILL
    assert zombie_exit(failed.pid, starts[failed.pid]) == 3 << 8
    assert zombie_exit(failed.pid, 1) is None  # another process's start: not this one


def test_the_kernels_process_events_give_each_exit_status() -> None:
    exits = ExitStatuses()
    if not exits.listen():
        pytest.skip(f"the kernel's process events cannot be listened to: {exits.refused}")
    try:
        killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        clean = subprocess.Popen(["true"])
        os.kill(killed.pid, signal.SIGKILL)
        for p in (killed, failed, clean):
            p.wait()
        wanted = {killed.pid, failed.pid, clean.pid}
        deadline = time.monotonic() + 10
        got: dict[int, int | None] = {}
        while len(got) < 3 and time.monotonic() < deadline:
            exits.drain(wanted)
            got.update({p: s for p in wanted if (s := exits.status(p)) is not None})
            time.sleep(0.05)
        assert got == {killed.pid: signal.SIGKILL, failed.pid: 3 << 8, clean.pid: 0}
    finally:
        exits.close()
    assert not exits.listening


def test_the_oom_killers_lines_are_read_by_pid_and_time() -> None:
    records = [
        (4563.07, b"Out of memory: Killed process 28451 (python3) total-vm:48229376kB"),
        (4563.08, b"oom-kill:constraint=CONSTRAINT_MEMCG,task=python,pid=28452,uid=1000"),
        (4570.00, b"Memory cgroup out of memory: Killed process 28453 (pt_main_thread)"),
        (4571.00, b"python invoked oom-killer: gfp_mask=0xcc0, order=0"),
    ]
    assert list(oom_kills(records)) == [(28451, 4563.07), (28452, 4563.08), (28453, 4570.0)]

    class Recorded(KernelLog):
        def _read(self) -> None:
            self._remember(oom_kills(records))

    kernel = Recorded()
    ticks = os.sysconf("SC_CLK_TCK")
    assert kernel.oom_killed(28451, int(4000 * ticks))
    assert not kernel.oom_killed(28451, int(5000 * ticks))  # a later process of that pid
    assert not kernel.oom_killed(1234, None)


def test_the_real_kernel_log_is_read_where_readable_and_said_where_not() -> None:
    kernel = KernelLog()
    assert not kernel.oom_killed(os.getpid(), started_at(os.getpid()))
    assert kernel.unreadable == "" or "/dev/kmsg" in kernel.unreadable
    nowhere = KernelLog("/nonexistent/kmsg")
    assert not nowhere.oom_killed(os.getpid(), None)
    assert nowhere.unreadable.startswith("/nonexistent/kmsg: No such file")


def test_without_dev_kmsg_the_journals_kernel_lines_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journalctl = tmp_path / "journalctl"
    journalctl.write_text(
        "#!/bin/sh\n"
        "echo '[ 4563.079551] gpu-7 kernel: Out of memory: Killed process 28451 (python3)'\n"
    )
    journalctl.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    kernel = KernelLog("/nonexistent/kmsg")
    assert kernel.oom_killed(28451, None) and kernel.unreadable == ""
    journalctl.write_text("#!/bin/sh\necho 'No journal files were found.' >&2\n")
    blind = KernelLog("/nonexistent/kmsg")
    assert not blind.oom_killed(28451, None)
    assert blind.unreadable.endswith("journalctl -k: No journal files were found.")


def writer(path: str = "/logs/plain/metrics.jsonl") -> RunProcess:
    return RunProcess("gpu-7", 4242, 99, "pid:[1]", path, 0, by=WRITER, command="python train.py")


@pytest.mark.parametrize(
    ("status", "oom", "torn", "recent", "ending"),
    [
        (0, False, False, True, Ending("finished")),
        (0, False, True, True, Ending("finished")),  # a status says more than its file
        (signal.SIGKILL, False, False, True, Ending("crashed", "was killed by SIGKILL")),
        (signal.SIGSEGV | 0x80, False, False, True,
         Ending("crashed", "was killed by SIGSEGV (core dumped)")),
        (signal.SIGTERM, False, False, True, Ending("cancelled", "was stopped by SIGTERM")),
        (3 << 8, False, False, False, Ending("crashed", "exited with status 3")),
        (signal.SIGKILL, True, False, True, Ending("crashed", "was killed by the OOM killer")),
        (None, True, False, False, Ending("crashed", "was killed by the OOM killer")),
        (None, False, True, True, Ending("crashed", "is gone, its last line cut off")),
        (None, False, False, True, Ending("exited", "is gone, its exit status unknown")),
        (None, False, False, False, Ending("")),  # stopped writing long before: not judged
    ],
)  # fmt: skip
def test_a_writers_end_is_judged_from_what_is_known(
    status: int | None, oom: bool, torn: bool, recent: bool, ending: Ending
) -> None:
    got = judge(writer(), status, oom=oom, torn=torn, recent=recent)
    assert got.state == ending.state
    prefix = "process 4242 (python train.py) on host gpu-7 "
    assert got.line == (prefix + ending.line if ending.line else "")


def test_runs_are_looked_for_when_they_first_grow_then_at_most_every_rescan(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    watch = WriterWatch(socket.gethostname(), own_namespace())
    files = {run: tmp_path / f"{run}.jsonl" for run in ("plain", "elsewhere", "tracked")}
    for path in files.values():
        path.write_text('{"step": 1}\n')
    children.append(job := hold(files["plain"], "a"))
    children.append(hold(files["tracked"], "a"))  # as wandb-core holds a W&B run's files

    def logs_of(runs: Collection[str]) -> dict[str, list[tuple[Path, str]]]:
        kinds = {"plain": "jsonl", "elsewhere": "jsonl", "tracked": "wandb"}
        return {run: [(files[run], kinds[run])] for run in runs if run in files}

    everyone = list  # no run is watched by a process yet
    assert watch.due(0.0, everyone) == []  # nothing grew
    for run in files:
        watch.grew(run)
    due = watch.due(0.0, everyone)
    assert sorted(due) == ["elsewhere", "plain", "tracked"]
    found = watch.find(due, logs_of)
    assert [(run, p.pid, p.by, p.path) for run, p in found] == [
        ("plain", job.pid, WRITER, str(files["plain"]))
    ]  # none for a tracker's run: its service writes it, and it says how it ended
    assert watch.scans == 1 and watch.scan_seconds > 0
    watch.grew("elsewhere")  # no writer found, still growing: again, not before RESCAN
    watch.grew("new")  # a run never looked for: at once
    assert watch.due(1.0, everyone) == ["new"]
    assert watch.due(RESCAN_SECONDS - 1, everyone) == []
    assert watch.due(RESCAN_SECONDS, everyone) == ["elsewhere"]
    watch.grew("plain")
    assert watch.due(3 * RESCAN_SECONDS, lambda runs: []) == []  # watched: not looked for
    watch.gone("plain")  # its writer's end ended it; written again, it is looked for at once
    watch.grew("plain")
    assert watch.due(3 * RESCAN_SECONDS + 1, everyone) == ["plain"]


def test_a_writer_gone_is_judged_by_its_status_its_file_and_its_files_age(
    tmp_path: Path, children: list[subprocess.Popen[bytes]]
) -> None:
    watch = WriterWatch(socket.gethostname(), "pid:[4026531836]")  # as the kernel's pids
    watch.exits.refused = "not listened to in this test"
    watch.kernel._tried = True  # nor the kernel log read
    watch.kernel._journal = False
    log, out = tmp_path / "metrics.jsonl", tmp_path / "stdout.log"
    log.write_text('{"step": 1, "loss": 0.5}\n')
    out.write_text("step 1")
    with log.open("a") as held:
        children.append(job := hold(out, "a", stdout=held))  # `... > stdout.log`, as it were
    logs = [(log, "jsonl"), (out, "text")]

    def found() -> RunProcess:
        [(_, process)] = watch.find(["plain"], lambda runs: {"plain": logs})
        return process

    assert watch.ending(found(), signal.SIGKILL).state == "crashed"  # a zombie's status
    assert watch.ending(found(), 0) == Ending("finished")
    # a text log's last line may be a prompt or a bar: not a cut record
    assert watch.ending(found(), None).line.endswith("is gone, its exit status unknown")
    with log.open("a") as f:
        f.write('{"step": 2, "lo')  # a buffer written up to where it was cut
    assert watch.ending(found(), None).line.endswith("is gone, its last line cut off")
    process = found()
    job.kill()
    job.wait()
    log.write_text('{"step": 1, "loss": 0.5}\n')  # whole: a cut line is a crash, however old
    old = time.time() - RECENT_SECONDS - 5
    for path in (log, out):
        os.utime(path, (old, old))
    assert watch.ending(process, None) == Ending("")  # stopped writing long before it went


def test_exit_statuses_are_listened_to_only_while_a_writer_is_watched() -> None:
    watch = WriterWatch(socket.gethostname(), "pid:[4026531836]")
    watch.watching({os.getpid()})
    if watch.exits.refused:
        pytest.skip(f"the kernel's process events cannot be listened to: {watch.exits.refused}")
    assert watch.exits.listening
    watch.watching(set())
    assert not watch.exits.listening
    elsewhere = WriterWatch(socket.gethostname(), "pid:[4026532000]")  # a container's pids
    elsewhere.watching({os.getpid()})
    assert not elsewhere.exits.listening
