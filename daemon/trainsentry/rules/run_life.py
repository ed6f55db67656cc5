"""Each run's life — running, stalled, finished, crashed (with its cause), preempted,
cancelled, exited — and the processes that write it.

Three witnesses tell how a run ends. Its text log says why it died (a
traceback, the OOM killer, Slurm's time limit: log_rules.py). The probe's end
record says it closed, cleanly or on an exception, so "finished" is certain
rather than guessed from silence. And on the job's own host the process
itself: the probe's meta record names host and pid, and a process gone
without an end record died (runtime/processes.py looks). Without the probe,
the process found holding the run's files open for writing is looked at the
same way (runtime/writers.py), and how it ended is what the kernel can say of
it: its exit status, the OOM killer's line. "exited" is a run whose writer is
gone while nothing could tell whether it finished or was killed. Where these
say nothing, a run that stops writing is only quiet (the no-data rules).

What the probe and the process say reaches the pattern rules as a line of
the run's life (`life_event`), so it pages through the same rules, with the
same `ends_run`, as a line the job wrote: the default pack's
`process_exited`, `process_gone` and `probe_ended_by_exception`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsentry.point import ProbeMark, TextEvent

# "exited": its writer is gone and nothing could say how (runtime/writers.py)
ENDINGS = frozenset({"crashed", "preempted", "cancelled", "finished", "exited"})


@dataclass(slots=True)
class RunLife:
    """What a run's logs say of it: running, or how it ended and why."""

    state: str = "running"  # running | stalled | (an ending: ENDINGS)
    cause: str = ""
    step: int = 0
    wall: float = math.nan  # of the last data seen, on the writer's clock or the reading's
    ended_wall: float = math.nan
    # ended by a catch-all (any traceback, the probe's exception end record): a more
    # telling rule's cause replaces it (the job's own traceback read after the end record)
    by_fallback: bool = False
    # ended by its writer's end (runtime/writers.py): a new process found writing its
    # files is a restart at once, where other ends wait for RESTART_GRACE of new data
    by_writer: bool = False
    # ended by its process's end seen from outside (the probe's or its writer's process
    # gone), with no line of its own: in a collective hang it may be the blocked rank,
    # which torchrun kills once the others' timeouts fail them (rules/hang.py)
    by_process: bool = False

    @property
    def ended(self) -> bool:
        return self.state in ENDINGS

    @property
    def told(self) -> str:
        """The state with its cause: "crashed: <cause>", "finished"."""
        return f"{self.state}: {self.cause}" if self.cause else self.state

    @property
    def reason(self) -> str:
        """A resolve's reason for the run's other alerts: "run crashed: <cause>"."""
        return f"run {self.told}"


PROBE, WRITER = "probe", "writer"  # how a process came to be watched


@dataclass(slots=True)
class RunProcess:
    """A process that writes a run: one a probe file's meta record names (`by` PROBE,
    `ended` once its end record came), or one found holding a run's file open for
    writing (WRITER, runtime/writers.py; `command` its command line, shortened)."""

    host: str
    pid: int
    pid_start: int | None  # clock ticks since boot: a later process of the same pid differs
    pid_ns: str  # its pid namespace: a daemon in another sees other processes by that pid
    path: str
    line: int
    ended: str = ""  # "" while it runs, else the end record's exit ("clean", "exception")
    by: str = PROBE
    command: str = ""

    @classmethod
    def of(cls, meta: ProbeMark) -> RunProcess:
        return cls(meta.host, meta.pid, meta.pid_start, meta.pid_ns, meta.path, meta.line)

    def checkable(self, host: str, namespace: str) -> bool:
        """Whether a daemon on `host`, in pid namespace `namespace`, can see it die."""
        return (
            not self.ended
            and self.pid > 0
            and self.pid_start is not None
            and self.host == host
            and self.pid_ns == namespace
        )

    def gone_line(self) -> str:
        """The probe's process gone without an end record (a writer's: `writer_line`)."""
        return f"process {self.pid} on host {self.host} exited without an end record"

    def writer_line(self, how: str) -> str:
        """A writer gone, and `how` ("was killed by SIGKILL", "exited with status 3")."""
        return f"process {self.pid} ({self.command}) on host {self.host} {how}"

    def said(self) -> dict[str, object]:
        """What `status` and /api/runs say of the watch (`watched`)."""
        out: dict[str, object] = {"by": self.by, "pid": self.pid, "host": self.host}
        if self.by == WRITER:
            out.update(command=self.command, file=self.path)
        return out


@dataclass(frozen=True, slots=True)
class Ending:
    """How a writer's run ended, as the runtime could tell it (runtime/writers.py):
    `state` an ending of ENDINGS, `line` the line of the run's life that says so
    ("" for a clean finish, which pages no one)."""

    state: str
    line: str = ""


def exception_line(end: ProbeMark) -> str:
    error = end.error or "an exception"
    return (
        f"process {end.pid} on host {end.host} ended with an exception at step {end.step}: "
        f"{error} (the probe's end record)"
    )


def life_event(run: str, path: str, line: int, wall: float, text: str) -> TextEvent:
    """What the probe or the process said, as a line of the run's life for the pattern rules."""
    return TextEvent(path, line, wall, (text,), "line", "", run)
