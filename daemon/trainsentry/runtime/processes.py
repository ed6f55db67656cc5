"""On the job's own host: is the process that writes a run still there?

A job killed by SIGKILL, the OOM killer or a node agent writes nothing more:
no traceback, no end record. Its logs only go quiet, which the no-data rules
can tell only after many minutes. When the daemon runs on the same host and
in the same pid namespace (meta's `host` and `pid_ns` equal this process's),
it can look at the process itself: gone without an end record is a crash.
Without the probe, the process found holding the run's files open for writing
(writers.py) is looked at the same way; how it ended is writers.py's to say.

A pid is reused once its process is gone, so a pid alone proves nothing; the
meta record also gives the process's start time (`pid_start`, field 22 of
/proc/<pid>/stat), and a process of that pid started at another time is
another process. A zombie (exited, not yet reaped by its parent) is gone; its
exit status is still in /proc then (field 52), and a look keeps it.

The look costs one small read per watched process every CHECK_SECONDS, on
the loop's tick whether data arrives or not. A process found gone is not
declared at once: what it wrote just before it exited (its end record) may
still wait in the kernel's event queue, so the run's files are read once
more (`Daemon.look_again`) and the process is declared gone only if the
next look, after that read, still finds no end record.

Linux only (/proc); elsewhere nothing is watched. `replay` has no process to
look at: a finished run's probe file tells only by its end record.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable

from trainsentry.rules.run_life import RunProcess

# A crash is paged within seconds: a look every 2 s is a read of /proc per watched
# process, about 20 µs each, so a thousand jobs on one host cost 1 % of a core.
CHECK_SECONDS = 2.0

Watched = tuple[str, RunProcess]  # (run, process)


def own_namespace() -> str:
    """This process's pid namespace ("pid:[4026531836]"); "" off Linux."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _stat(pid: int) -> list[bytes]:
    """/proc/<pid>/stat's fields from the third (the state) on; [] when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _int(fields: list[bytes], field: int) -> int | None:
    """proc(5)'s field number `field` (1-based; fields[0] is field 3) as an int."""
    try:
        return int(fields[field - 3])
    except (IndexError, ValueError):
        return None


def started_at(pid: int) -> int | None:
    """The start time (clock ticks since boot) of a live process; None when it is gone."""
    fields = _stat(pid)
    if not fields or fields[0] in (b"Z", b"X"):  # exited, not reaped (or being reaped)
        return None
    return _int(fields, 22)


def zombie_exit(pid: int, start: int | None) -> int | None:
    """The exit status (as wait(2) gives it) of the process `pid` started at `start`, if
    it has exited and its parent has not reaped it yet; None otherwise, or where this
    process may not read it (/proc shows 0 then: proc(5), field 52)."""
    fields = _stat(pid)
    if not fields or fields[0] != b"Z" or _int(fields, 22) != start:
        return None
    try:  # the access the kernel asks before it shows exit_code (a ptrace read)
        os.close(os.open(f"/proc/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY))
    except OSError:
        return None
    return _int(fields, 52)  # exit_code, since Linux 3.5


def alive(process: RunProcess) -> bool:
    return started_at(process.pid) == process.pid_start


def _gone(watched: Iterable[Watched]) -> list[Watched]:
    """The watched whose process is gone, each process looked up once: one process may
    write the files of many runs (a sweep in one process), and /proc is read per look."""
    looked: dict[tuple[int, int | None], bool] = {}
    gone = []
    for run, process in watched:
        key = (process.pid, process.pid_start)
        if key not in looked:
            looked[key] = alive(process)
        if not looked[key]:
            gone.append((run, process))
    return gone


class ProcessCheck:
    """Finds the watched processes that are gone, in two looks (see the module)."""

    def __init__(self, host: str | None = None, namespace: str | None = None) -> None:
        self.host = socket.gethostname() if host is None else host
        self.namespace = own_namespace() if namespace is None else namespace
        self.next_look = 0.0
        self._suspects: set[tuple[str, str]] = set()  # (run, path) found gone once
        # (pid, start) → exit status of a suspect seen as a zombie, until the next look
        self.zombies: dict[tuple[int, int | None], int] = {}

    @property
    def enabled(self) -> bool:
        return bool(self.namespace)

    @property
    def suspects(self) -> bool:
        return bool(self._suspects)

    def look(self, watched: Iterable[Watched], now: float) -> set[str]:
        """The runs with a process found gone: their files are to be read once more."""
        self.next_look = now + CHECK_SECONDS
        gone = _gone(watched)
        self.zombies = {}
        for _, p in gone:
            status = zombie_exit(p.pid, p.pid_start)
            if status is not None:
                self.zombies[(p.pid, p.pid_start)] = status
        self._suspects |= {(run, p.path) for run, p in gone}
        return {run for run, _ in gone}

    def confirm(self, watched: Iterable[Watched]) -> list[tuple[str, str]]:
        """The suspects still gone, still without an end record, after their files' read."""
        suspects, self._suspects = self._suspects, set()
        return [
            (run, p.path) for run, p in _gone(w for w in watched if (w[0], w[1].path) in suspects)
        ]
