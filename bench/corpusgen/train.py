"""The training loop every corpus run goes through, and the label it leaves.

One loop for all models and faults, written like an ordinary PyTorch loop:
sample a batch, forward, backward, measure the total gradient norm before
clipping (as the HF Trainer and Lightning report it), step, log every step,
validate every `val_every` steps. It stops a few steps after the loss stops
being finite or explodes, as a real loop does when the user's NaN check or the
process gives up.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn

from corpusgen import data, models
from corpusgen.faults import (
    UNPREDICTABLE,
    RunSpec,
    StepClock,
    apply_model_fault,
    corrupt,
    fault_lr_factor,
    is_nan_step,
    poison,
    schedule_factor,
)
from corpusgen.writers import TAKES_WALLTIME, TrainRecord, open_writer

# A loss this many times the first step's loss counts as exploded (a crash).
EXPLODED = 1e4
# A crash this soon after its cause leaves no room for a warning: not "predictable".
MIN_WARNING_WINDOW = 20
# Steps a loop keeps logging after the crash before it stops.
STEPS_AFTER_CRASH = 3
# Simulated runs start here (2026-11-17), one day apart, so wall times are reproducible.
EPOCH_START = 1_795_000_000.0


@dataclass
class History:
    """What the loop saw, for the label and the corpus summary."""

    loss: list[float] = field(default_factory=list)
    grad_norm: list[float] = field(default_factory=list)
    val: list[tuple[int, float]] = field(default_factory=list)
    crash_step: int | None = None


def _optimizer(spec: RunSpec, model: nn.Module) -> torch.optim.Optimizer:
    if spec.optimizer == "SGD":
        return torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=0.9)
    return torch.optim.Adam(model.parameters(), lr=spec.lr)


def _loss(out: Tensor, y: Tensor) -> Tensor:
    if y.is_floating_point():
        return nn.functional.mse_loss(out, y)
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _val_loss(model: nn.Module, split: data.Split) -> float:
    model.eval()
    with torch.no_grad():
        total = 0.0
        chunks = 0
        for i in range(0, len(split.x), 256):
            total += float(_loss(model(split.x[i : i + 256]), split.y[i : i + 256]))
            chunks += 1
    model.train()
    return total / chunks


def _layer_norms(model: nn.Module) -> dict[str, float]:
    """Per-module gradient norms (weights and biases together); 0 for a frozen module."""
    out: dict[str, float] = {}
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        g = 0.0 if p.grad is None else float(p.grad.detach().norm()) ** 2
        out[module] = out.get(module, 0.0) + g
    return {k: math.sqrt(v) for k, v in out.items()}


def _crashed(loss: float, grad_norm: float, first: float) -> bool:
    return not math.isfinite(loss) or not math.isfinite(grad_norm) or loss > EXPLODED * first


def train(spec: RunSpec, run_dir: Path, index: int) -> dict[str, object]:
    """Train `spec` into `run_dir` (replaced if present) and return its label."""
    torch.manual_seed(spec.seed)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    ds = data.load(spec.task or models.TASK_OF[spec.model], spec.seed, spec.train_size)
    model = models.build(spec.model, ds.classes, depth=spec.depth, width=spec.width)
    opt = _optimizer(spec, model)
    writer = open_writer(spec.writer, run_dir, spec.optimizer, spec.val_every)
    clock = StepClock(spec, EPOCH_START + 86_400.0 * index)
    gen = torch.Generator().manual_seed(5000 + spec.seed)
    hist = History()
    started = time.perf_counter()
    try:
        for step in range(spec.steps):
            _one_step(spec, step, model, opt, ds, gen, clock, writer, hist)
            if hist.crash_step is not None and step >= hist.crash_step + STEPS_AFTER_CRASH:
                break
    finally:
        writer.close()
    label = _label(spec, hist, time.perf_counter() - started)
    (run_dir / "label.json").write_text(json.dumps(label, indent=1) + "\n")
    # The raw per-step series, for corpus statistics (Keras logs only running means).
    history = {"loss": hist.loss, "grad_norm": hist.grad_norm, "val": hist.val}
    (run_dir / "history.json").write_text(json.dumps(history) + "\n")
    return label


def _one_step(
    spec: RunSpec,
    step: int,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    ds: data.Dataset,
    gen: torch.Generator,
    clock: StepClock,
    writer: object,
    hist: History,
) -> None:
    lr = spec.lr * schedule_factor(spec, step) * fault_lr_factor(spec, step)
    for group in opt.param_groups:
        group["lr"] = lr
    idx = torch.randint(0, len(ds.train.x), (spec.batch,), generator=gen)
    x, y = corrupt(spec, step, ds.train.x[idx], ds.train.y[idx], ds.classes, gen)
    apply_model_fault(spec, step, model)
    hook = poison(model) if is_nan_step(spec, step) else None
    loss = _loss(model(x), y)
    if hook is not None:
        hook.remove()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    params = [p for p in model.parameters() if p.grad is not None]
    layer_norms = _layer_norms(model) if spec.writer == "jsonl_plain" else {}
    max_norm = spec.clip if spec.clip is not None else float("inf")
    grad_norm = float(nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
    opt.step()
    took = clock.tick(step)
    value = loss.item()
    hist.loss.append(value)
    hist.grad_norm.append(grad_norm)
    if hist.crash_step is None and _crashed(value, grad_norm, hist.loss[0]):
        hist.crash_step = step
    rec = TrainRecord(step, clock.now, value, grad_norm, lr, took, layer_norms)
    writer.train(rec)  # type: ignore[attr-defined]
    if (step + 1) % spec.val_every == 0:
        val = _val_loss(model, ds.val)
        hist.val.append((step, val))
        writer.val(step, clock.now, val)  # type: ignore[attr-defined]


def _label(spec: RunSpec, hist: History, seconds: float) -> dict[str, object]:
    """label.json: the ground truth the detection benchmark scores against.

    `onset_step` is when the fault began acting; for overfitting, which has no
    single cause step, it is the evaluation with the lowest validation loss
    (after it, validation only gets worse). `predictable` says whether the
    crash (if any) could be seen coming: not a NaN batch (no dynamics at all),
    and at least MIN_WARNING_WINDOW steps after the fault began — a 50x lr
    jump that blows up 5 steps later is a crash no detector can call 10 steps
    ahead, and counting it would measure the fault, not the detector.
    """
    onset = spec.onset
    if spec.fault == "overfitting" and hist.val:
        onset = min(hist.val, key=lambda sv: sv[1])[0]
    elif spec.fault == "vanishing":
        onset = 0
    crashed = hist.crash_step is not None
    predictable = (
        crashed
        and spec.fault not in UNPREDICTABLE
        and hist.crash_step - (onset or 0) >= MIN_WARNING_WINDOW  # type: ignore[operator]
    )
    spec_fields = asdict(spec)
    return {
        "healthy": spec.fault is None,
        "fault": spec.fault,
        "onset_step": onset,
        "crash_step": hist.crash_step,
        "predictable": predictable,
        "model": spec.model,
        "writer": spec.writer,
        "trap": spec.trap,
        "seed": spec.seed,
        "steps_logged": len(hist.loss),
        "steps_per_epoch": spec.val_every,
        "walltime": "simulated" if spec.writer in TAKES_WALLTIME else "real",
        "first_loss": hist.loss[0],
        "train_seconds": round(seconds, 2),
        "spec": spec_fields,
    }
