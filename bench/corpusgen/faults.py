"""What a run is: its schedule, its benign trap or its fault, and how each acts.

A fault acts through the same levers a real bug does — the learning rate the
optimizer sees, the batch the model gets, the model's parameters, the clock —
and never through the logged numbers themselves, so the symptoms a detector
sees are the training dynamics' own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

FAULTS = (
    "lr_jump",
    "lr_ramp",
    "nan_batch",
    "corrupt_batches",
    "vanishing",
    "dead_relu",
    "overfitting",
    "lr_zero",
    "loader_stall",
    "frozen_layers",
)

# Crashes a detector can see coming from the dynamics; a NaN batch cannot be.
UNPREDICTABLE = frozenset({"nan_batch"})


@dataclass(frozen=True)
class RunSpec:
    """One corpus run. `param`/`duration` mean what the fault (or trap) says they mean."""

    name: str
    model: str
    writer: str
    seed: int
    steps: int = 600
    optimizer: str = "Adam"  # "Adam" | "SGD" (momentum 0.9)
    lr: float = 1e-3
    batch: int = 64
    clip: float | None = None  # max grad norm; the logged norm is always the pre-clip one
    schedule: str = "warmup_constant"
    warmup: int = 20
    trap: str | None = None  # the benign difficulty of a healthy run
    fault: str | None = None
    onset: int | None = None
    param: float = 0.0
    duration: int = 0
    train_size: int | None = None
    depth: int | None = None
    width: int | None = None
    val_every: int = 25
    task: str | None = None  # another task for the model family (e.g. regression)


def schedule_factor(spec: RunSpec, step: int) -> float:
    """The multiplier of the base lr a healthy scheduler would give at `step`."""
    warm = min(1.0, (step + 1) / spec.warmup) if spec.warmup > 0 else 1.0
    kind = spec.schedule
    if kind == "warmup_constant":
        return warm
    if kind == "warmup_cosine":
        if step < spec.warmup:
            return warm
        progress = (step - spec.warmup) / max(1, spec.steps - spec.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
    if kind == "cosine_restarts":
        period = int(spec.param) or 150
        phase = (step % period) / period
        return warm * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * phase)))
    if kind == "step_up":
        # A stage change (e.g. unfreezing) raises the lr: a bump the run recovers from.
        return warm * (spec.param if step >= spec.steps // 2 else 1.0)
    raise ValueError(f"unknown schedule {kind!r}")


def fault_lr_factor(spec: RunSpec, step: int) -> float:
    """The extra multiplier a learning-rate fault applies on top of the schedule."""
    if spec.onset is None or step < spec.onset:
        return 1.0
    if spec.fault == "lr_jump":
        return spec.param
    if spec.fault == "lr_ramp":
        return spec.param ** (step - spec.onset)
    if spec.fault == "lr_zero":
        return 0.0
    return 1.0


def corrupt(
    spec: RunSpec, step: int, x: Tensor, y: Tensor, classes: int, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Corrupted batches for `duration` steps: wrong labels and badly scaled inputs.

    For token inputs the text is replaced by uniform noise (a corrupted shard);
    for float inputs the targets are random and the inputs scaled by `param`
    (a missing normalisation step).
    """
    if spec.fault != "corrupt_batches" or spec.onset is None:
        return x, y
    if not spec.onset <= step < spec.onset + spec.duration:
        return x, y
    if y.is_floating_point():
        y = torch.randn(y.shape, generator=gen) * spec.param
    else:
        y = torch.randint(0, classes, y.shape, generator=gen)
    if x.dtype == torch.long:
        return torch.randint(0, classes, x.shape, generator=gen), y
    return x * spec.param, y


def is_nan_step(spec: RunSpec, step: int) -> bool:
    return spec.fault == "nan_batch" and step == spec.onset


def poison(module: nn.Module) -> torch.utils.hooks.RemovableHandle:
    """A NaN in the first layer's output: a corrupt sample or an fp16 overflow upstream.

    Token inputs cannot hold a NaN, so the poison goes in after the first
    module (the embedding), which is where a bad value would first appear.
    """
    first = next(m for m in module.modules() if not list(m.children()))

    def hook(_m: nn.Module, _inp: object, out: Tensor) -> Tensor:
        out = out.clone()
        out.view(-1)[0] = float("nan")
        return out

    return first.register_forward_hook(hook)


def apply_model_fault(spec: RunSpec, step: int, model: nn.Module) -> None:
    """Faults that act on the parameters once, at onset."""
    if spec.onset is None or step != spec.onset:
        return
    if spec.fault == "dead_relu":
        # A bad update that pushed pre-activations negative: most units die at once.
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, nn.Linear | nn.Conv2d) and m is not getattr(model, "head", None):
                    m.bias -= spec.param
    elif spec.fault == "frozen_layers":
        # requires_grad switched off for all but the head (a wrong `freeze` list).
        for name, p in model.named_parameters():
            if not name.startswith("head."):
                p.requires_grad_(False)


class StepClock:
    """A simulated step-time clock: realistic jitter, deterministic per seed.

    Tiny CPU models take milliseconds per step with scheduler noise that says
    nothing about real jobs, so the clock models a GPU job instead: a base
    time per model family, lognormal jitter, a slow first step after each
    evaluation (cache refill) and after each checkpoint every 200 steps. The
    loader-stall fault adds to it; nothing sleeps.
    """

    BASE: ClassVar[dict[str, float]] = {
        "mlp": 0.06,
        "sigmoid": 0.06,
        "cnn": 0.12,
        "transformer": 0.35,
        "lstm": 0.25,
        "rnn": 0.2,
    }

    def __init__(self, spec: RunSpec, start: float) -> None:
        self._spec = spec
        self._base = self.BASE[spec.model]
        self._gen = torch.Generator().manual_seed(7000 + spec.seed)
        self.now = start

    def tick(self, step: int) -> float:
        """Advance past `step`; return how long the step took."""
        spec = self._spec
        took = self._base * math.exp(0.08 * float(torch.randn(1, generator=self._gen)))
        if step > 0 and step % spec.val_every == 0:
            took += 2 * self._base
        if step > 0 and step % 200 == 0:
            took += 6 * self._base
        if spec.fault == "loader_stall" and spec.onset is not None:
            if spec.duration > 0 and spec.onset <= step < spec.onset + spec.duration:
                took *= spec.param  # a slow loader: every step waits
            elif spec.duration == 0 and step == spec.onset:
                took += spec.param  # a hang: one step waits `param` seconds
        self.now += took
        return took
