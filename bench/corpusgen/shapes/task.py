"""The task every framework-shape run learns, and the in-process pieces they share.

Gaussian clusters (10 classes in 32 dimensions) are learnable to a low loss
(~0.05), so a fault's damage is large against the run's best, and with a few
hundred samples a model memorises the training set while its validation
loss still sits at its best: the normal generalisation gap of a small-data
classifier, which the pack must not take for a fault. The same data reaches
every framework as numpy or torch arrays.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from corpusgen.shapes.spec import (
    BURST_FACTOR,
    PACE_FLOOR_S,
    ShapeRun,
    in_burst,
    is_slow_step,
    label_noise,
    paced,
)

DIM = 32
CLASSES = 10
SEPARATION = 1.0
VAL_SIZE = 1000
# A loss this many times the first step's loss counts as exploded (a crash).
EXPLODED = 1e4
# Logging intervals a job keeps going after a crash before it is stopped.
INTERVALS_AFTER_CRASH = 3


@dataclass
class Data:
    x: np.ndarray
    y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray


def clusters(seed: int, train_size: int) -> Data:
    """Class means drawn once per seed; samples are a mean plus unit Gaussian noise."""
    rng = np.random.default_rng(1000 + seed)
    means = rng.standard_normal((CLASSES, DIM)) * SEPARATION / math.sqrt(2)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, CLASSES, n)
        x = means[y] + rng.standard_normal((n, DIM))
        return x.astype(np.float32), y.astype(np.int64)

    x, y = draw(train_size)
    val_x, val_y = draw(VAL_SIZE)
    return Data(x, y, val_x, val_y)


class Body(nn.Module):
    """Two ReLU layers and a head: `head.` is what frozen_layers leaves trainable."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(DIM, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU()
        )
        self.head = nn.Linear(width, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def pretrain(model: nn.Module, data: Data, seed: int, steps: int = 400) -> None:
    """Train `model` briefly on a related task (the same inputs, labels renamed), then
    give it a fresh head: the starting point of a fine-tune, which learns slowly."""
    perm = torch.from_numpy(np.random.default_rng(seed).permutation(CLASSES))
    x, y = torch.from_numpy(data.x), perm[torch.from_numpy(data.y)]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    head = model.head  # type: ignore[union-attr]
    assert isinstance(head, nn.Linear)
    head.reset_parameters()


def noisy_labels(run: ShapeRun, step: int, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`y` with the level-shift fault's share of labels replaced by random classes."""
    share = label_noise(run, step)
    if share <= 0:
        return y
    y = y.copy()
    hit = rng.random(len(y)) < share
    y[hit] = rng.integers(0, CLASSES, int(hit.sum()))
    return y


def poison_hook(module: nn.Module) -> torch.utils.hooks.RemovableHandle:
    """A NaN in the first layer's output for one forward: a corrupt sample upstream."""
    first = next(m for m in module.modules() if isinstance(m, nn.Linear))

    def hook(_m: nn.Module, _inp: object, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        out.view(-1)[0] = float("nan")
        return out

    return first.register_forward_hook(hook)


def freeze_all_but_head(model: nn.Module) -> None:
    """requires_grad off for every parameter outside `head.` (a wrong freeze list)."""
    for name, p in model.named_parameters():
        if ".head." not in f".{name}":
            p.requires_grad_(False)


@dataclass
class Monitor:
    """What a run's training loop saw, step by step, whatever the framework.

    Each framework's callback reports every finished optimizer step here with
    its raw (per-batch) loss; the monitor measures the crash, stretches slow
    steps for the slowdown fault, and says when a crashed job stops.
    """

    run: ShapeRun
    losses: list[tuple[int, float]] = field(default_factory=list)
    crash_step: int | None = None
    slow_base: float | None = None  # seconds per step before the slowdown, measured
    _ends: list[float] = field(default_factory=list)
    _start: float = field(default_factory=time.perf_counter)

    def step_done(self, step: int, loss: float) -> bool:
        """Record `step`; sleep if it is slowed; True when the job should stop now."""
        self.losses.append((step, loss))
        first = self.losses[0][1]
        exploded = math.isfinite(first) and loss > EXPLODED * first
        if self.crash_step is None and (not math.isfinite(loss) or exploded):
            self.crash_step = step
        if paced(self.run) and self._ends:
            time.sleep(max(0.0, self._ends[-1] + PACE_FLOOR_S - time.perf_counter()))
        slow = is_slow_step(self.run, step)
        burst = in_burst(self.run, time.perf_counter() - self._start)
        if slow or burst:
            if self.slow_base is None:
                # the mean pace, evaluations and logging included: what the logged
                # wall times show, so ×5 is ×5 there (the median batch was ×2.5 there)
                ends = self._ends[-101:]
                self.slow_base = (ends[-1] - ends[0]) / (len(ends) - 1) if len(ends) > 1 else 0.005
            factor = BURST_FACTOR if burst else self.run.param or 5.0
            time.sleep((factor - 1.0) * self.slow_base)
        self._ends.append(time.perf_counter())
        if len(self._ends) > 200:
            del self._ends[:100]
        after = INTERVALS_AFTER_CRASH * self.run.spec.log_every
        return self.crash_step is not None and step >= self.crash_step + max(after, 3)
