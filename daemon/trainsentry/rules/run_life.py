"""Each run's life — running, stalled, finished, crashed (with its cause), preempted,
cancelled — and the processes the probe says write it.

Three witnesses tell how a run ends. Its text log says why it died (a
traceback, the OOM killer, Slurm's time limit: log_rules.py). The probe's end
record says it closed, cleanly or on an exception, so "finished" is certain
rather than guessed from silence. And on the job's own host the process
itself: the probe's meta record names host and pid, and a process gone
without an end record died (runtime/processes.py looks). Where these say
nothing, a run that stops writing is only quiet (the no-data rules).

What the probe and the process say reaches the pattern rules as a line of
the run's life (`life_event`), so it pages through the same rules, with the
same `ends_run`, as a line the job wrote: the default pack's
`process_exited` and `probe_ended_by_exception`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsentry.point import ProbeMark, TextEvent

ENDINGS = frozenset({"crashed", "preempted", "cancelled", "finished"})


@dataclass(slots=True)
class RunLife:
    """What a run's logs say of it: running, or how it ended and why."""

    state: str = "running"  # running | stalled | crashed | preempted | cancelled | finished
    cause: str = ""
    step: int = 0
    wall: float = math.nan  # of the last data seen, on the writer's clock or the reading's
    ended_wall: float = math.nan
    # ended by a catch-all (any traceback, the probe's exception end record): a more
    # telling rule's cause replaces it (the job's own traceback read after the end record)
    by_fallback: bool = False

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


@dataclass(slots=True)
class ProbeProcess:
    """A process a probe file's meta record names; `ended` once its end record came."""

    host: str
    pid: int
    pid_start: int | None  # clock ticks since boot: a later process of the same pid differs
    pid_ns: str  # its pid namespace: a daemon in another sees other processes by that pid
    path: str
    line: int
    ended: str = ""  # "" while it runs, else the end record's exit ("clean", "exception")

    @classmethod
    def of(cls, meta: ProbeMark) -> ProbeProcess:
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
        return f"process {self.pid} on host {self.host} exited without an end record"


def exception_line(end: ProbeMark) -> str:
    error = end.error or "an exception"
    return (
        f"process {end.pid} on host {end.host} ended with an exception at step {end.step}: "
        f"{error} (the probe's end record)"
    )


def life_event(run: str, path: str, line: int, wall: float, text: str) -> TextEvent:
    """What the probe or the process said, as a line of the run's life for the pattern rules."""
    return TextEvent(path, line, wall, (text,), "line", "", run)
