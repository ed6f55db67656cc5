"""The attempts of a job across restarts: a restart said with its cause, a storm, no progress.

Long jobs survive by restarting from a checkpoint (torchrun `--max-restarts`,
Slurm `--requeue`, a scheduler's retries), and the costliest failures are in
that loop: a job that crash-loops on a bad node burns hours while each of its
attempts looks like an ordinary short run. So the attempts of a job are
followed as one story, from what the logs already say:

- torchrun's `attempt_<N>/` directories (jobs/identity.py: `Member.attempt`),
  each agent's (`Member.agent`) numbered from 0;
- a run whose step goes back and goes on (a job appending to its log after it
  resumed from a checkpoint): from there it is another attempt of its run;
- a line that says the job will run again into the same logs (Slurm's `DUE TO JOB
  REQUEUE`: a pattern rule's `new_attempt`, `boundary`): the run's next record begins
  another attempt, wherever its step is (a job requeued right after a save resumes at
  the step it had logged last).

An attempt begins with its first point and is judged as it goes: where it
resumed (its first step), how far it got (its highest step), and how the one
before it ended (the cause its ranks' text logs or the probe said). Rules of
the condition kind `restarts` fire on the run that began the new attempt:

- `restarts: {}`: each restart, with the cause of the attempt before and the
  steps and time lost (the work since the step it resumed from);
- `restarts: {storm: N, within: SPAN}`: N restarts within that span;
- `restarts: {no_progress: N}`: the last N attempts each ended no further than
  the job had got before them.

All on the writers' own stamps and steps, so `replay` says what `run` says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise

from trainsentry.jobs import member_of
from trainsentry.rules import model as m
from trainsentry.rules.condition import fmt

# attempts one job keeps: a crash loop of a thousand restarts needs only the last few to
# say it is one (storms and "no progress" look back over a handful)
MAX_ATTEMPTS = 64
# Slurm says the job is cancelled (requeued, preempted) as it sends SIGTERM, and sends
# SIGKILL KillWait later (30 s by default): the attempt's handlers may log and save until
# then, so its records within this span after the line are its last words, not the next
# attempt (which Slurm schedules only once this one is gone).
LAST_WORDS_SECONDS = 30.0
# An attempt that ends this soon after its first step died young: a healthy attempt runs
# for hours until a preemption or a planned stop, and one that fails within 10 minutes of
# starting fails in its set-up or first steps (a GPU's Xid, NCCL's init, a full local
# disk), where a node's fault shows.
YOUNG_SECONDS = 600.0
# A node is named once this many of the job's recent attempts on it died young: one is a
# flake any node may have; two on the same node, with the job moved elsewhere meanwhile or
# not, is the node to drain first.
YOUNG_ON_NODE = 2
MAX_NODE_CHARS = 256  # a host name (RFC 1035: 253); a longer one is cut
MAX_CLOSED = 65_536  # runs waiting for their next attempt (a fleet's, requeued at once)
MAX_WORDS = 64  # ranks whose word on an attempt's end is kept: the first to speak say it
MAX_SHAPES = 256  # record shapes a run's steps are followed by (a new one per line: bounded)
# A relaunch begins after the attempt before it went quiet: torchrun's agent takes 7-13 s
# from a crash to the new attempt's first step (measured on 4 CPU ranks), a scheduler's
# requeue minutes. Another node's agent of the same launch logs while this one does.
CONCURRENT_SECONDS = 1.0


@dataclass(slots=True)
class Attempt:
    """One attempt of a job: where it resumed, how far it got, when, and how it ended."""

    key: tuple[str, ...]  # (agent, attempt) for torchrun; (run, n) for a log that rewound
    run: str  # the run whose point began it
    first_step: int
    first_wall: float
    last_step: int
    last_wall: float
    high_step: int
    cause: str = ""  # how it ended, when a rank's log said it (_tell)
    # False for an attempt torchrun's numbering says began and ended without a point
    # logged (a rendezvous that failed, a crash in the first step): inferred, not seen
    logged: bool = True
    number: int = 1  # its place among the job's attempts, from 1 (`status` shows it)
    node: str = ""  # the host it ran on, where a line or the probe named it
    # each rank's word on how it ended, in the order they first spoke: run → (cause, whether
    # it only waited on a peer), the first MAX_WORDS ranks'
    words: dict[str, tuple[str, bool]] = field(default_factory=dict)

    @property
    def young(self) -> bool:
        """It ended soon after it began (judged once another began after it)."""
        return self.logged and self.last_wall - self.first_wall < YOUNG_SECONDS


@dataclass(slots=True)
class JobAttempts:
    attempts: list[Attempt] = field(default_factory=list)
    by_key: dict[tuple[str, ...], Attempt] = field(default_factory=dict)
    rewinds: dict[str, int] = field(default_factory=dict)  # run → its attempts by rewinding
    best: int = -(2**62)  # the highest step any attempt reached
    # of attempts not seen yet: their ranks' words (Attempt.words)
    causes: dict[tuple[str, ...], dict[str, tuple[str, bool]]] = field(default_factory=dict)
    begun: int = 0  # attempts ever begun (the list keeps the last MAX_ATTEMPTS)

    def add(self, attempt: Attempt) -> None:
        self.begun += 1
        attempt.number = self.begun
        self.attempts.append(attempt)
        self.by_key[attempt.key] = attempt


@dataclass(frozen=True, slots=True)
class Restart:
    """A new attempt of a job, as the rules judge it."""

    job: str
    run: str
    step: int
    wall: float
    attempt: Attempt
    before: Attempt
    restarts: int  # of the job so far
    recent: list[Attempt]  # the job's attempts, oldest first

    def lost_steps(self) -> int:
        return max(0, self.before.high_step - self.attempt.first_step)

    def lost_seconds(self) -> float:
        """The wall time the last attempt that stepped spent on the steps this one does
        again, and the time since it stopped: what the restart cost."""
        logged = [a for a in self.recent[:-1] if a.logged]
        if not logged:
            return 0.0
        last = logged[-1]
        steps = last.high_step - last.first_step
        pace = (last.last_wall - last.first_wall) / steps if steps > 0 else 0.0
        redone = self.lost_steps() * pace if math.isfinite(pace) else 0.0
        gap = self.attempt.first_wall - last.last_wall
        return max(0.0, redone) + max(0.0, gap if math.isfinite(gap) else 0.0)


class Attempts:
    """Every job's attempts (see the module)."""

    def __init__(self) -> None:
        self._jobs: dict[str, JobAttempts] = {}
        self._current: dict[str, Attempt] = {}  # run → the attempt its points belong to
        # run → record shape → its latest step: a run's series read one file after another
        # (MLflow's file store, Keras' train/ and validation/) each go back to their
        # first step, and that is no resume; a series of the run going back is
        self._last: dict[str, dict[object, int]] = {}
        # run → when a line said its attempt ended: its next record after the grace begins
        # another attempt (boundary)
        self._closed: dict[str, float] = {}
        self._node_of: dict[str, str] = {}  # run → the host its latest process started on

    def saw(self, run: str, step: int, wall: float, shape: object = None) -> Restart | None:
        """A run's record (of `shape`: its tags): the restart it begins, if it begins one."""
        current = self._current.get(run)
        shapes = self._last.get(run)
        if shapes is None:
            shapes = self._last[run] = {}
        last = shapes.get(shape)
        closed = self._closed.get(run)
        going_on = closed is None or not wall > closed + LAST_WORDS_SECONDS
        if current is not None and going_on and (last is None or step >= last):
            if len(shapes) < MAX_SHAPES or last is not None:
                shapes[shape] = step
            current.last_step = max(current.last_step, step)
            current.last_wall = max(current.last_wall, wall)
            if step > current.high_step:
                current.high_step = step
                known = self._jobs[member_of(run).job]
                known.best = max(known.best, step)
            return None
        self._last[run] = {shape: step}  # the others begin afresh: this is a new attempt
        self._closed.pop(run, None)
        member = member_of(run)
        job = self._jobs.get(member.job)
        if job is None:
            job = self._jobs[member.job] = JobAttempts()
        if current is not None:  # the step went back (or a line said so): another attempt
            n = job.rewinds[run] = job.rewinds.get(run, 0) + 1
            key: tuple[str, ...] = (member.group, str(n))  # its ranks rewind together
        elif member.attempt is not None:
            key = (member.agent, str(member.attempt))
        else:
            key = (member.group, "0")
        attempt = job.by_key.get(key)
        before = job.attempts[-1] if job.attempts else None
        # another torchrun agent's first point while the job's attempt still logs: the
        # other node of one launch, not a relaunch (that begins after a crash's silence)
        if (
            attempt is None
            and before is not None
            and key[0] != before.key[0]
            and wall <= before.last_wall + CONCURRENT_SECONDS
        ):
            attempt = job.by_key[key] = before
        if attempt is not None:  # another rank (or node) of an attempt already begun
            self._current[run] = attempt
            if not attempt.logged:  # its end was read before its first points: it logged
                attempt.logged, attempt.first_step, attempt.first_wall = True, step, wall
            attempt.last_step = max(attempt.last_step, step)
            attempt.last_wall = max(attempt.last_wall, wall)
            attempt.high_step = max(attempt.high_step, step)
            job.best = max(job.best, step)
            return None
        if before is not None and member.attempt is not None and before.key[0] == key[0]:
            before = self._unseen(job, before, key, member.attempt, wall)
        attempt = Attempt(key, run, step, wall, step, wall, step)
        attempt.node = self._node_of.get(run, "")
        self._current[run] = attempt
        self._add(job, attempt)
        job.best = max(job.best, step)
        if before is None:
            return None
        return Restart(
            member.job, run, step, wall, attempt, before, len(job.attempts) - 1,
            list(job.attempts),
        )  # fmt: skip

    @staticmethod
    def _add(job: JobAttempts, attempt: Attempt) -> None:
        job.add(attempt)
        if len(job.attempts) > MAX_ATTEMPTS:
            gone = job.attempts.pop(0)
            job.by_key = {k: a for k, a in job.by_key.items() if a is not gone}

    def _unseen(
        self, job: JobAttempts, before: Attempt, key: tuple[str, ...], number: int, wall: float
    ) -> Attempt:
        """The attempts of this torchrun agent numbered between the one before and this one,
        which logged no point (a rendezvous that failed): restarts all the same, counted
        as begun now. The last of them, or `before` where there are none."""
        try:
            seen = int(before.key[1])
        except ValueError:
            return before
        for missing in range(seen + 1, number):
            gap = (key[0], str(missing))
            unseen = Attempt(
                gap, before.run, before.high_step, wall, before.high_step, wall,
                before.high_step, logged=False,
            )  # fmt: skip
            for run, word in job.causes.pop(gap, {}).items():
                _tell(unseen, run, *word)
            job.add(unseen)
            before = unseen
        return before

    def ended(
        self,
        run: str,
        cause: str,
        wall: float = math.nan,
        *,
        failed: bool = False,
        waited: bool = False,
    ) -> Restart | None:
        """A rank's log said at `wall` how its attempt ended (a crash's cause; one that
        `waited` on a peer says less than the peer's own). A torchrun attempt that `failed`
        before any point of it was read, after an earlier attempt of its agent, is a restart
        all the same (a rendezvous that failed: a crash loop whose relaunches all die there
        logs no step again), judged now: the Restart."""
        current = self._current.get(run)
        if current is not None:
            _tell(current, run, cause, waited)
            return None
        member = member_of(run)
        if member.attempt is None:
            return None
        job = self._jobs.get(member.job)
        if job is None:
            job = self._jobs[member.job] = JobAttempts()
        key = (member.agent, str(member.attempt))
        known = job.by_key.get(key)
        if known is not None:  # another rank of it said so first
            _tell(known, run, cause, waited)
            return None
        before = job.attempts[-1] if job.attempts else None
        if (
            not failed
            or before is None
            or before.key[0] != key[0]
            or not before.key[1].isdigit()
            or not math.isfinite(wall)
        ):
            words = job.causes.get(key)
            if words is None and len(job.causes) < MAX_ATTEMPTS:
                words = job.causes[key] = {}  # its cause waits for its first point
            if words is not None:
                _keep(words, run, cause, waited)
            return None
        if int(before.key[1]) >= member.attempt:
            return None  # an earlier attempt's rank, read late
        before = self._unseen(job, before, key, member.attempt, wall)
        high = before.high_step
        attempt = Attempt(key, run, high, wall, high, wall, high, logged=False)
        _tell(attempt, run, cause, waited)
        attempt.node = self._node_of.get(run, "")
        self._add(job, attempt)
        return Restart(member.job, run, high, wall, attempt, before, len(job.attempts) - 1,
                       list(job.attempts))  # fmt: skip

    def boundary(self, run: str, cause: str, wall: float) -> None:
        """A line said at `wall` that the run's attempt ended and the job runs again into
        the same logs (Slurm requeued it): its next record past the attempt's last words
        begins another attempt, and this one ended with `cause`."""
        current = self._current.get(run)
        if current is None:
            return
        # the scheduler's word first, over the signal that ended its process
        others = {k: v for k, v in current.words.items() if k}
        current.words = {"": (cause, False), **others}
        _tell(current, "", cause, False)
        if run in self._closed or len(self._closed) < MAX_CLOSED:
            self._closed[run] = wall

    def starts_on(self, run: str, node: str) -> None:
        """The run's process started on `node` (the probe's meta record names its host): its
        attempt, and the attempts it begins after, ran there unless a line says otherwise."""
        node = node[:MAX_NODE_CHARS]
        if run in self._node_of or len(self._node_of) < MAX_CLOSED:
            self._node_of[run] = node
        current = self._current.get(run)
        if current is not None and not current.node:
            current.node = node

    def ran_on(self, run: str, node: str) -> None:
        """A line of the run's attempt names the node it runs on (Slurm's `*** JOB 123 ON
        node07 CANCELLED ...`): that attempt's node."""
        current = self._current.get(run)
        if current is not None:
            current.node = node[:MAX_NODE_CHARS]

    def of(self, run: str) -> tuple[int, int] | None:
        """(attempts the run's job began, the number of the one the run's points are in),
        as `status` shows them; None for a run with no point yet."""
        current = self._current.get(run)
        job = self._jobs.get(member_of(run).job) if current is not None else None
        if current is None or job is None:
            return None
        return job.begun, current.number

    def forget(self, run: str) -> None:
        self._current.pop(run, None)
        self._last.pop(run, None)
        self._closed.pop(run, None)
        self._node_of.pop(run, None)


def _keep(words: dict[str, tuple[str, bool]], run: str, cause: str, waited: bool) -> None:
    """A rank's word on how an attempt ended, among the first MAX_WORDS ranks' (a later one
    of the same rank replaces its own: a specific rule's over the generic traceback's)."""
    if run in words or len(words) < MAX_WORDS:
        words[run] = (cause, waited)


def _tell(attempt: Attempt, run: str, cause: str, waited: bool) -> None:
    """A rank's word kept, and the attempt's cause said again: the first rank's that did
    not only wait on a peer (when one rank raises, the others' collectives end on the
    connection it closed, and which rank's log is read first is chance), else the first."""
    _keep(attempt.words, run, cause, waited)
    said = [c for c, w in attempt.words.values() if not w] or [c for c, _ in attempt.words.values()]
    if said:
        attempt.cause = said[0]


def judged(spec: m.Restarts, restart: Restart) -> tuple[bool, str]:
    """Whether a restart trips the rule, and the evidence said in its message."""
    attempt, before = restart.attempt, restart.before
    number = restart.attempt.key[1] if restart.attempt.key[1].isdigit() else None
    began = (
        f" resumed at step {attempt.first_step}"
        if attempt.logged
        else f" ended before its first step: {attempt.cause}"
    )
    said = (
        f"{restart.job} restarted: attempt {int(number) + 1 if number else len(restart.recent)}"
        f"{began}; the attempt before got to step {before.high_step}"
        + (f" and ended: {before.cause}" if before.cause else "")
        + f"; {restart.lost_steps()} steps and {duration(restart.lost_seconds())} of work lost"
    )
    said += young_on_nodes(restart.recent[:-1])
    restarts = restart.recent[1:]  # the first attempt is no restart
    if spec.storm is not None and spec.within is not None:
        window = [a for a in restarts if attempt.first_wall - a.first_wall <= spec.within]
        if len(window) < spec.storm:
            return False, said
        return True, f"{said}; {len(window)} restarts in {duration(spec.within)}"
    if spec.no_progress is not None:
        last = [a for a in restarts if a.logged][-spec.no_progress :]
        if len(last) < spec.no_progress:
            return False, said
        if any(later.first_step > earlier.first_step for earlier, later in pairwise(last)):
            return False, said
        return True, (
            f"{said}; the last {spec.no_progress} restarts all resumed at step"
            f" {last[0].first_step} or before: no checkpoint advanced between them"
        )
    return True, said


def young_on_nodes(ended: list[Attempt]) -> str:
    """The nodes where YOUNG_ON_NODE or more of the job's ended attempts died young, as a
    restart's message says them; "" for none."""
    on: dict[str, list[Attempt]] = {}
    for attempt in ended:
        if attempt.node:
            on.setdefault(attempt.node, []).append(attempt)
    said = ""
    for node, attempts in sorted(on.items(), key=lambda n: -sum(a.young for a in n[1])):
        young = sum(a.young for a in attempts)
        if young >= YOUNG_ON_NODE:
            said += (
                f"; attempts on node {node} keep dying young: {young} of its {len(attempts)}"
                f" ended within {duration(YOUNG_SECONDS)} of their start"
            )
    return said


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{fmt(seconds)} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
