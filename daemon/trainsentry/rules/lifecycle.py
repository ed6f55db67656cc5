"""The alert lifecycle: a pure state machine on the data's own clock.

Prometheus' semantics, moved from wall-clock evaluation ticks onto the run's
step axis: a condition that holds goes *pending*, and *firing* once it has held
for `for` (steps, seconds of the run's wall time, or logged points); a firing
alert stays firing until the condition has been quiet for `keep_firing_for`,
then *resolves*. Nothing here reads a clock or does I/O, so one sequence of
verdicts always yields one sequence of events — that is what makes a replay of
finished logs a faithful backtest of the live daemon.

Severity only goes up while an alert lives: an escalation from warning to
critical is the same alert with a new severity (one event, "escalated"), and
it does not step back down until resolved, so a flapping projection cannot
page, un-page and page again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainsentry.rules.model import ACTIVE, HELD, QUIET, Span

INACTIVE, PENDING, FIRING = 0, 1, 2

# events returned by Lifecycle.observe
BECAME_PENDING = "pending"
FIRED = "firing"
ESCALATED = "escalated"
RESOLVED = "resolved"
CANCELLED = "cancelled"  # pending that never fired


def _reached(span: Span | None, steps: float, seconds: float, points: int) -> bool:
    return span is None or span.reached(steps, seconds, points)


@dataclass(slots=True)
class Lifecycle:
    for_: Span | None = None
    keep_firing_for: Span | None = None
    phase: int = INACTIVE
    level: int = QUIET  # ACTIVE or CRITICAL while pending/firing
    since_step: int = 0
    since_wall: float = 0.0
    active_points: int = 0  # consecutive active verdicts in this streak
    last_step: int = 0  # last active verdict
    last_wall: float = 0.0
    quiet_points: int = 0  # quiet verdicts since the last active one

    def observe(
        self,
        verdict: int | None,
        step: int,
        wall_time: float,
        before: tuple[int, float] | None = None,
    ) -> str | None:
        """Advance on one verdict (None: the condition could not judge this point).

        `before`: the (step, wall time) of the series' previous point. A logged
        point stands for the interval since that one (HF logs the mean loss of
        its last 500 steps; a NaN gradient norm logged at step 1000 is what the
        job had then, not a single step of it), so a streak that a point opens
        is taken to have begun there, and a `for` in steps or seconds means
        the same at every cadence: `for: 16 steps` waits 16 points when every
        step is logged and none when the points are 500 steps apart. A `for`
        in points counts points, whatever they span.
        """
        if verdict is None:
            return None
        if verdict == HELD:
            if self.phase == FIRING:  # held in the band: as if still past the threshold
                self.last_step, self.last_wall, self.quiet_points = step, wall_time, 0
                return None
            verdict = QUIET
        if verdict >= ACTIVE:
            self.last_step, self.last_wall, self.quiet_points = step, wall_time, 0
            if self.phase == INACTIVE:
                self.phase, self.level = PENDING, verdict
                self.since_step, self.since_wall = (
                    before if before is not None else (step, wall_time)
                )
                self.active_points = 1
                return FIRED if self._fire() else BECAME_PENDING
            if self.phase == PENDING:
                self.active_points += 1
                self.level = max(self.level, verdict)
                return FIRED if self._fire() else None
            if verdict > self.level:
                self.level = verdict
                return ESCALATED
            return None
        if self.phase == PENDING:
            self.reset()
            return CANCELLED
        if self.phase == FIRING:
            self.quiet_points += 1
            if _reached(
                self.keep_firing_for,
                step - self.last_step,
                _elapsed(wall_time, self.last_wall),
                self.quiet_points,
            ):
                self.reset()
                return RESOLVED
        return None

    def _fire(self) -> bool:
        held = _reached(
            self.for_,
            self.last_step - self.since_step,
            _elapsed(self.last_wall, self.since_wall),
            self.active_points,
        )
        if held:
            self.phase = FIRING
        return held

    def stop(self) -> bool:
        """End the alert from outside (run finished, data stopped); True if it was firing."""
        was_firing = self.phase == FIRING
        self.reset()
        return was_firing

    def reset(self) -> None:
        self.phase, self.level, self.active_points, self.quiet_points = INACTIVE, QUIET, 0, 0

    @property
    def firing(self) -> bool:
        return self.phase == FIRING


def _elapsed(later: float, earlier: float) -> float:
    return later - earlier if math.isfinite(later) and math.isfinite(earlier) else 0.0
