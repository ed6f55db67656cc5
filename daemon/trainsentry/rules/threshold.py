"""Layer 1, absolute conditions: a single point decides.

The cheapest checks, and the only ones that need no history. A threshold has
a separate resolve level (hysteresis): a gradient norm hovering around its
ceiling would otherwise fire and resolve on alternate points.
"""

from __future__ import annotations

import math

from trainsentry.rules.condition import RunView, fmt
from trainsentry.rules.model import ACTIVE, CRITICAL, HELD, QUIET, NonFinite, Threshold


class NonFiniteCondition:
    """A NaN/inf value; with `other`, only beside the other series' value of the same step.

    The other series must be logged at this very step, before this one (in the
    same record): a value from an earlier record says nothing of this step's.
    """

    __slots__ = ("other", "spec", "value")

    def __init__(self, spec: NonFinite) -> None:
        self.spec = spec
        self.value = 0.0
        self.other = math.nan

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        self.value = value
        if math.isfinite(value):
            return QUIET
        spec = self.spec
        if spec.other is None or spec.other_at_most is None:
            return ACTIVE
        other = run.other(spec.other)
        self.other = other.value if other is not None and other.step == step else math.nan
        return ACTIVE if self.other <= spec.other_at_most else QUIET

    def evidence(self) -> str:
        if math.isfinite(self.value):
            return f"is finite ({fmt(self.value)})"
        if self.spec.other is None or math.isnan(self.other):
            return f"is {self.value}"
        return f"is {self.value} while {self.spec.other} of the same step is {fmt(self.other)}"


class ThresholdCondition:
    """Past the threshold is ACTIVE; between it and the resolve level, HELD.

    The band is judged by the lifecycle, not here: it keeps an alert that
    fires firing, but a pending one must see every point of its `for` past
    the threshold itself (a condition that latched on its own first hit would
    let one point over the line and a hundred inside the band fire).
    """

    __slots__ = ("spec", "value")

    def __init__(self, spec: Threshold) -> None:
        self.spec = spec
        self.value = math.nan

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        if math.isnan(value):
            return None  # NaN is neither above nor below; the non_finite rule speaks for it
        self.value = value
        spec = self.spec
        held = False
        if spec.above is not None:
            if value > spec.above:
                return self._level(value)
            band = spec.resolve_below if spec.resolve_below is not None else spec.above
            held = value >= band
        if spec.below is not None:
            if value < spec.below:
                return self._level(value)
            band = spec.resolve_above if spec.resolve_above is not None else spec.below
            held = held or value <= band
        return HELD if held else QUIET

    def _level(self, value: float) -> int:
        spec = self.spec
        if (spec.critical_above is not None and value > spec.critical_above) or (
            spec.critical_below is not None and value < spec.critical_below
        ):
            return CRITICAL
        return ACTIVE

    def evidence(self) -> str:
        spec, value = self.spec, self.value
        if spec.above is not None and (spec.below is None or value > spec.below):
            limit = f"above the threshold {fmt(spec.above)}"
            if spec.resolve_below is not None:
                limit += f" (resolves under {fmt(spec.resolve_below)})"
        elif spec.below is not None:
            limit = f"under the floor {fmt(spec.below)}"
            if spec.resolve_above is not None:
                limit += f" (resolves over {fmt(spec.resolve_above)})"
        else:
            limit = ""
        return f"is {fmt(value)}, {limit}" if limit else f"is {fmt(value)}"
