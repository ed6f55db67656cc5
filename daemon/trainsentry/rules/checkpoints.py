"""A job's checkpoints against its progress: overdue while it logs, and the work a crash lost.

A checkpoint is what a crash falls back to, so the costly failure is a job that
goes on training while its saves have stopped (a full disk it does not notice,
a callback that raised and was swallowed, a save schedule a resume reset): the
loss looks fine until the node dies, and then hours are gone. So the checkpoints
a job saves (sources/checkpoints.py: a row per complete checkpoint, on the run
of its checkpoint root) are held against what the job logs:

- its cadence is learned from the checkpoints themselves, in steps and in time
  (the medians of the last intervals between them, by step);
- each record the job logs is judged against the newest checkpoint at or before
  its step: overdue once it is `overdue` × the cadence past it in steps *and* in
  time. Both, so a job that slowed down (same steps, more time: throughput_drop's)
  or sped up between saves on a timer is not overdue, and a job paused between
  two records (no steps) is not either. Where the first record past the
  checkpoint came more than a cadence after it, the time counts from that record:
  a job restarted from it (minutes to get a node, load the model) did no work in
  between, and logs its first steps faster than its next checkpoint's files settle;
- when one of the job's runs crashes or hangs, the same judgement at its last
  record says whether the work since the last checkpoint is lost.

Where the checkpoints live decides which records are the job's: the checkpoint
run and the runs at or below it, by path or by job (jobs/identity.py): Lightning's
`version_0/checkpoints/` is on the run `version_0`, which logs them; HF's
`output_dir/checkpoint-500/` on the run `output_dir`, whose `runs/<date>/` logs
are a run below it; torchrun's ranks `<job>_<agent>/attempt_0/<rank>` below a
`<job>_<agent>/checkpoints/`, or of the job `<job>`. One alert per checkpoint
run, however many of its runs log. All on the writers' stamps and the files'
mtimes, so `replay` says what `run` says.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from itertools import pairwise

from trainsentry.jobs import member_of, same_job
from trainsentry.rules import model as m
from trainsentry.rules.attempts import duration
from trainsentry.rules.condition import fmt, median

# checkpoints kept per job: the cadence is the median of the last intervals, and the
# newest at or before a record's step is nearly always the newest of all
KEPT = 32
INTERVALS = 8  # the cadence's intervals: the last few, so a changed schedule is learned
# runs whose job is cached (a fleet's runs, looked up once each, not per record)
CACHED_RUNS = 65_536


@dataclass(slots=True)
class Lag:
    """How far a record of the job is past its newest checkpoint at or before it."""

    saved_step: int
    saved_wall: float
    step: int
    wall: float
    every_steps: float
    every_seconds: float

    @property
    def steps(self) -> int:
        return self.step - self.saved_step

    @property
    def seconds(self) -> float:
        return self.wall - self.saved_wall

    def overdue(self, spec: m.Checkpoints) -> bool:
        return self.steps >= spec.overdue * self.every_steps and self.seconds >= max(
            spec.overdue * self.every_seconds, spec.min_late
        )

    def cadence(self) -> str:
        return f"every {fmt(self.every_steps)} steps, {duration(self.every_seconds)}"

    def times(self) -> str:
        """×3.6 its cadence in steps and ×3.2 in time."""
        by_steps = self.steps / self.every_steps if self.every_steps > 0 else math.inf
        by_time = self.seconds / self.every_seconds if self.every_seconds > 0 else math.inf
        return f"×{fmt(by_steps)} its cadence in steps and ×{fmt(by_time)} in time"


@dataclass(slots=True)
class JobCheckpoints:
    """The checkpoints of one checkpoint run, and the latest record its job logged."""

    run: str
    steps: list[int] = field(default_factory=list)  # by step, the last KEPT
    walls: list[float] = field(default_factory=list)  # each one's completion
    every_steps: float = math.nan
    every_seconds: float = math.nan
    intervals: int = 0  # intervals the cadence is the median of
    logged: tuple[int, float] | None = None  # the job's latest record (by stamp)
    past: tuple[int, float] | None = None  # (a checkpoint's step, the first record past it)

    def saved(self, step: int, wall: float) -> bool:
        """A complete checkpoint; False for one already held (a restart's told again)."""
        i = bisect.bisect_left(self.steps, step)
        if i < len(self.steps) and self.steps[i] == step:
            return False
        self.steps.insert(i, step)
        self.walls.insert(i, wall)
        if len(self.steps) > KEPT:
            del self.steps[0], self.walls[0]
        steps, walls = self.steps[-INTERVALS - 1 :], self.walls[-INTERVALS - 1 :]
        gaps = [(b - a, y - x) for (a, x), (b, y) in pairwise(zip(steps, walls, strict=True))]
        gaps = [(s, t) for s, t in gaps if s > 0 and math.isfinite(t) and t > 0]
        self.intervals = len(gaps)
        if gaps:
            self.every_steps = median([float(s) for s, _ in gaps])
            self.every_seconds = median([t for _, t in gaps])
        return True

    def note(self, step: int, wall: float) -> None:
        if self.logged is None or not wall < self.logged[1]:
            self.logged = (step, wall)
        i = self.newest_before(step)
        if i >= 0 and step > self.steps[i] and (self.past is None or self.past[0] != self.steps[i]):
            self.past = (self.steps[i], wall)

    def newest_before(self, step: int) -> int:
        """The index of the newest checkpoint at or before `step`; -1 for none."""
        if self.steps and self.steps[-1] <= step:
            return len(self.steps) - 1
        return bisect.bisect_right(self.steps, step) - 1

    def lag(self, step: int, wall: float, learn: int) -> Lag | None:
        """How far (step, wall) is past the newest checkpoint before it; None before the
        cadence is learned from `learn` intervals, or with no checkpoint before it."""
        if self.intervals < learn:
            return None
        i = self.newest_before(step)
        if i < 0:
            return None
        since, past = self.walls[i], self.past
        # a first record past it later than a whole cadence: the job was paused or
        # restarted, and its work resumed there
        if past is not None and past[0] == self.steps[i] and past[1] - since > self.every_seconds:
            since = past[1]
        return Lag(self.steps[i], since, step, wall, self.every_steps, self.every_seconds)

    def since(self, step: int, wall: float) -> str:
        """The work since the newest checkpoint before (step, wall), as a crash's page says
        it; "" with no checkpoint before it."""
        i = self.newest_before(step)
        if i < 0:
            return ""
        steps, seconds = step - self.steps[i], wall - self.walls[i]
        return (
            f"{steps} steps and {duration(max(0.0, seconds))} since the last checkpoint"
            f" (step {self.steps[i]})"
        )


class CheckpointBook:
    """Every checkpoint run's checkpoints, and which runs' records are its job's."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobCheckpoints] = {}
        self._of: dict[str, JobCheckpoints | None] = {}  # a run → its checkpoint run's

    @property
    def active(self) -> bool:
        """Any checkpoint seen: until then a record costs nothing here."""
        return bool(self._jobs)

    def saved(self, run: str, step: int, wall: float) -> JobCheckpoints | None:
        """A complete checkpoint on `run`; its job's checkpoints, None for one held already."""
        job = self._jobs.get(run)
        if job is None:
            job = self._jobs[run] = JobCheckpoints(run)
            self._of.clear()  # runs looked up before may be this one's now
        return job if job.saved(step, wall) else None

    def job_of(self, run: str) -> JobCheckpoints | None:
        """The checkpoints whose job a record of `run` is: the nearest checkpoint run at or
        above it, by its path or its job's (jobs/identity.py)."""
        try:
            return self._of[run]
        except KeyError:
            pass
        found = None
        for name in (run, member_of(run).job):
            while name and found is None:
                found = self._jobs.get(name)
                name = name.rpartition("/")[0]
        if len(self._of) >= CACHED_RUNS:
            self._of.clear()
        self._of[run] = found
        return found

    def related(self, run: str) -> JobCheckpoints | None:
        """The checkpoints of `run`'s job wherever they are (a crash told by a text log
        above the job's checkpoint root): job_of, else any of one job with it."""
        found = self.job_of(run)
        if found is not None:
            return found
        return next((j for name, j in self._jobs.items() if same_job(name, run)), None)

    def forget(self, run: str) -> None:
        if self._jobs.pop(run, None) is not None:
            self._of.clear()
        self._of.pop(run, None)


def overdue_message(job: JobCheckpoints, lag: Lag) -> str:
    return (
        f"{job.run}: no checkpoint since step {lag.saved_step} while the job went on to step"
        f" {lag.step}: {lag.steps} steps and {duration(lag.seconds)} of work unsaved,"
        f" {lag.times()} (it checkpointed {lag.cadence()})"
    )


def lost_message(run: str, how: str, job: JobCheckpoints, lag: Lag) -> str:
    """`how`: "crashed", or "hung" (a no-data rule fired: hung, dead, or finished unseen)."""
    if how == "crashed":
        what, at_risk = "crashed", "is lost"
    else:
        what, at_risk = "went quiet (hung, dead or finished)", "is lost unless it comes back"
    return (
        f"{run} {what} while its checkpoints were overdue: the work since the last checkpoint"
        f" (step {lag.saved_step}) {at_risk}: {lag.steps} steps and {duration(lag.seconds)},"
        f" {lag.times()} (it checkpointed {lag.cadence()})"
    )
