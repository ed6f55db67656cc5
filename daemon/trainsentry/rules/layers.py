"""One rule on the layers of one run, each against the largest at the same step.

Vanishing gradients in a deep saturating stack leave the total norm healthy:
the head carries it while the first layers get 1e-10 of it, from the first
step. Only the layers compared with each other show it, so a rule reads every
per-layer gradient norm of a run (`grad_norm/*`) and judges each against the
largest of them at the same step; never against the layer's own past, which
is tiny from the start.

The layers of a step come one value after another (the engine judges a step's
values in tag order), so a layer is compared with each other layer's newest
value of this step or of the step the run's layers were logged at before it:
the layers not yet in at this step stand with their last values, and a layer
that stopped being logged (frozen, detached) drops out after one step.

A bias is left out, as a series judged and as the largest: a bias's gradient
is the sum of its layer's output gradients, zero up to rounding where a
normalisation removes the mean right after it (a Linear before a BatchNorm;
attention's key bias before the softmax). In a healthy BatchNorm stack those
biases get 1e-9 of the largest gradient while every weight gets over 5e-3.
"""

from __future__ import annotations

import math

from trainsentry.rules.condition import RunView, fmt
from trainsentry.rules.model import ACTIVE, HELD, QUIET, AcrossLayers

NO_STEP = -(2**62)


def is_bias(tag: str) -> bool:
    """A parameter named a bias (torch's `bias`, `in_proj_bias`, LSTM's `bias_ih_l0`)."""
    last = tag.rpartition(".")[2].rpartition("/")[2]
    return last == "bias" or last.endswith("_bias") or last.startswith("bias_")


class LayerGroup:
    """The newest value of each layer of one rule in one run, and the largest of them.

    The largest other layer is found in amortised O(1) a point: the two largest
    values of this step so far, and the values of the step before, sorted once
    when the step changes, whose layers logged again at this step are dropped
    from the top as they are met (their newest value is this step's).
    """

    __slots__ = ("carried", "latest", "previous", "step", "top")

    def __init__(self) -> None:
        self.latest: dict[str, tuple[int, float]] = {}  # tag → (step, value)
        self.step = NO_STEP  # the newest step a layer was logged at
        self.previous = NO_STEP  # the step before it that layers were logged at
        self.top: list[tuple[float, str]] = []  # this step's two largest, largest first
        self.carried: list[tuple[float, str]] = []  # the step before's, ascending

    def push(self, tag: str, step: int, value: float) -> None:
        if step < self.step:  # the run resumed from a checkpoint: compare afresh
            self.latest.clear()
            self.step = self.previous = NO_STEP
            self.top, self.carried = [], []
        if step > self.step:
            self.carried = sorted((v, t) for t, (s, v) in self.latest.items() if s == self.step)
            self.previous, self.step, self.top = self.step, step, []
        self.latest[tag] = (step, value)
        if any(t == tag for _, t in self.top):  # a second value of a layer in one step
            top = [(v, t) for t, (s, v) in self.latest.items() if s == step]
        else:
            top = [*self.top, (value, tag)]
        top.sort(reverse=True)
        self.top = top[:2]

    def largest(self, than: str) -> tuple[str, float] | None:
        """The largest other layer logged at this step or the one before; None if none."""
        best = next(((t, v) for v, t in self.top if t != than), None)
        carried, latest, step = self.carried, self.latest, self.step
        while carried and latest[carried[-1][1]][0] == step:
            carried.pop()  # logged again at this step: its newest value is in `top`
        for value, tag in reversed(carried):
            if best is not None and value <= best[1]:
                break
            if tag != than and latest[tag][0] != step:
                return tag, value
        return best


class AcrossLayersCondition:
    """A layer's value under `ratio_below` × the largest layer's at the same step."""

    __slots__ = ("group", "largest", "ratio", "spec", "tag", "value")

    def __init__(self, spec: AcrossLayers, tag: str, group: LayerGroup) -> None:
        self.spec = spec
        self.tag = tag
        self.group = group
        self.value = math.nan
        self.ratio = math.nan
        self.largest: tuple[str, float] | None = None

    def update(self, step: int, wall_time: float, value: float, run: RunView) -> int | None:
        self.value = value
        if not math.isfinite(value) or value < 0 or is_bias(self.tag):
            return None  # a NaN is the non-finite rules'; a bias is no layer's signal
        group = self.group
        group.push(self.tag, step, value)
        self.largest = largest = group.largest(self.tag)
        if largest is None or largest[1] <= value:
            self.ratio = 1.0
            return QUIET
        self.ratio = ratio = value / largest[1]
        spec = self.spec
        if ratio < spec.ratio_below:
            return ACTIVE
        return HELD if ratio < spec.resolve_above else QUIET

    def evidence(self) -> str:
        largest = self.largest
        if largest is None:
            return f"is {fmt(self.value)}, with no other layer to compare"
        return (
            f"is {fmt(self.value)}, {self.ratio:.3g} of the largest layer's at this step "
            f"({largest[0]}: {fmt(largest[1])}; the floor is {fmt(self.spec.ratio_below)})"
        )
