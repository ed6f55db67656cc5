"""The corpus composition: which runs exist, and why each is there.

Every fault appears on several model families and at least two seeds, so a
detector's result on it is not a one-off; healthy runs carry the benign traps
that make naive rules cry wolf (noisy small batches, warm restarts, long
warm-up, tiny fine-tuning lr, a scheduled lr step-up). Writers rotate so every
fault is seen through several naming conventions.

Fault strengths come from trying them on these models, not from the detector:
an lr jump on these small fp32 models mostly ends in collapse (dead units,
loss at chance) or a noisy high-loss regime rather than a NaN, and that is
what the labels record — `crash_step` is measured, never assumed. The lr
ramp (an unbounded warm-up, ×1.02–1.03 per step) is what reliably diverges,
after one to three hundred steps of visibly growing loss and gradient norm.
"""

from __future__ import annotations

from itertools import cycle

from corpusgen.faults import RunSpec
from corpusgen.writers import TAKES_WALLTIME, WRITERS

REG = "teacher_reg"  # the MLP/sigmoid regression variant (MSE: genuine SGD blow-up)


def _healthy() -> list[dict[str, object]]:
    plain = [
        dict(model="mlp", trap="plain"),
        dict(model="cnn", trap="plain", schedule="warmup_cosine"),
        dict(model="transformer", trap="plain", batch=32, schedule="warmup_cosine", steps=500),
        dict(model="lstm", trap="plain", batch=32, lr=3e-3),
        dict(model="sigmoid", trap="plain"),
        dict(model="rnn", trap="plain", batch=32, optimizer="SGD", lr=0.3),
        dict(model="mlp", trap="plain", task=REG, optimizer="SGD", lr=0.01, seed=1),
        dict(model="sigmoid", trap="plain", task=REG, optimizer="SGD", lr=0.05, seed=1),
    ]
    traps = [
        dict(model="mlp", trap="noisy_small_batch", batch=4),
        dict(model="cnn", trap="noisy_small_batch", batch=4, seed=1),
        dict(model="transformer", trap="noisy_small_batch", batch=4, steps=500, seed=1),
        dict(model="mlp", trap="warm_restarts", schedule="cosine_restarts", param=150, lr=3e-3),
        dict(
            model="transformer",
            trap="warm_restarts",
            schedule="cosine_restarts",
            param=150,
            batch=32,
            lr=2e-3,
            steps=500,
        ),
        dict(model="cnn", trap="long_warmup", schedule="warmup_cosine", warmup=300, lr=3e-3),
        dict(model="lstm", trap="long_warmup", schedule="warmup_cosine", warmup=250, batch=32),
        dict(model="mlp", trap="slow_finetune", lr=1e-5, seed=2),
        dict(model="transformer", trap="slow_finetune", lr=3e-5, batch=32, steps=500, seed=2),
        dict(
            model="mlp", trap="lr_step_up", schedule="step_up", param=3.0, optimizer="SGD", lr=0.03
        ),
        dict(model="cnn", trap="lr_step_up", schedule="step_up", param=5.0, seed=2),
    ]
    return [dict(r) for r in plain + traps]


def _faults() -> list[dict[str, object]]:
    sgd_reg = dict(task=REG, optimizer="SGD")
    runs: list[dict[str, object]] = []
    # LR jump: a resumed job with the wrong schedule; strength from 20x (SGD) to 500x (Adam).
    for seed in (0, 1):
        runs += [
            dict(model="mlp", fault="lr_jump", onset=150, param=20, lr=0.01, seed=seed, **sgd_reg),
            dict(
                model="sigmoid", fault="lr_jump", onset=200, param=50, lr=0.05, seed=seed, **sgd_reg
            ),
        ]
    runs += [
        dict(model="cnn", fault="lr_jump", onset=150, param=100),
        dict(model="transformer", fault="lr_jump", onset=150, param=500, batch=32, steps=450),
    ]
    # LR ramp: a warm-up that never stops multiplying; gradients grow until the run blows up.
    for seed in (0, 1):
        runs += [
            dict(
                model="mlp", fault="lr_ramp", onset=150, param=1.02, lr=0.01, seed=seed, **sgd_reg
            ),
            dict(model="transformer", fault="lr_ramp", onset=150, param=1.03, batch=32, seed=seed),
        ]
    runs += [
        dict(model="sigmoid", fault="lr_ramp", onset=200, param=1.02, lr=0.05, **sgd_reg),
        dict(model="cnn", fault="lr_ramp", onset=150, param=1.03, optimizer="SGD", lr=0.05),
        dict(model="lstm", fault="lr_ramp", onset=150, param=1.03, batch=32, lr=3e-3, seed=1),
        dict(
            model="rnn", fault="lr_ramp", onset=150, param=1.02, batch=32, optimizer="SGD", lr=0.3
        ),
    ]
    # NaN batch: no warning possible; the loss is NaN the step it arrives.
    runs += [
        dict(model="mlp", fault="nan_batch", onset=300),
        dict(model="cnn", fault="nan_batch", onset=250, seed=1),
        dict(model="transformer", fault="nan_batch", onset=200, batch=32, steps=400),
        dict(model="lstm", fault="nan_batch", onset=350, batch=32, lr=3e-3, seed=1),
    ]
    # Corrupted batches: a bad shard for 8 steps; a spike, then recovery.
    runs += [
        dict(model="mlp", fault="corrupt_batches", onset=300, duration=8, param=5.0),
        dict(model="cnn", fault="corrupt_batches", onset=300, duration=8, param=5.0, seed=1),
        dict(
            model="transformer", fault="corrupt_batches", onset=250, duration=8, batch=32, steps=500
        ),
        dict(model="lstm", fault="corrupt_batches", onset=300, duration=8, batch=32, lr=3e-3),
        dict(
            model="mlp",
            fault="corrupt_batches",
            onset=300,
            duration=8,
            param=5.0,
            seed=1,
            **sgd_reg,
            lr=0.01,
        ),
    ]
    # Vanishing gradients: a deep plain sigmoid stack trained with SGD.
    runs += [
        dict(model="sigmoid", fault="vanishing", depth=16, optimizer="SGD", lr=0.1, seed=0),
        dict(model="sigmoid", fault="vanishing", depth=16, optimizer="SGD", lr=0.1, seed=1),
        dict(model="sigmoid", fault="vanishing", depth=24, optimizer="SGD", lr=0.3, seed=2),
    ]
    # Dead ReLUs: a bad update pushes every hidden bias negative.
    for seed in (0, 1):
        runs += [
            dict(model="mlp", fault="dead_relu", onset=250, param=2.0, seed=seed),
            dict(model="cnn", fault="dead_relu", onset=250, param=2.0, seed=seed),
        ]
    # Overfitting: a tiny training set and a model that can memorise it.
    runs += [
        dict(model="mlp", fault="overfitting", train_size=64, width=512, seed=0),
        dict(model="mlp", fault="overfitting", train_size=64, width=512, seed=1),
        dict(model="cnn", fault="overfitting", train_size=48, lr=3e-3),
        dict(model="transformer", fault="overfitting", train_size=12, batch=12, lr=2e-3, steps=500),
        dict(model="lstm", fault="overfitting", train_size=12, batch=12, lr=1e-2),
    ]
    # LR stuck at zero: the scheduler returns 0 once warm-up ends.
    runs += [
        dict(model="mlp", fault="lr_zero", onset=100, warmup=100),
        dict(model="cnn", fault="lr_zero", onset=100, warmup=100, seed=1),
        dict(model="transformer", fault="lr_zero", onset=100, warmup=100, batch=32, steps=450),
        dict(model="lstm", fault="lr_zero", onset=150, warmup=150, batch=32, lr=3e-3, seed=1),
    ]
    # Data-loader stall: every step 8x slower for 120 steps, or one 15-minute hang.
    runs += [
        dict(model="mlp", fault="loader_stall", onset=300, param=8.0, duration=120),
        dict(model="cnn", fault="loader_stall", onset=300, param=8.0, duration=120, seed=1),
        dict(model="lstm", fault="loader_stall", onset=250, param=900.0, batch=32, lr=3e-3),
        dict(model="mlp", fault="loader_stall", onset=350, param=900.0, seed=1),
    ]
    # Frozen layers: all but the head stop receiving gradients.
    runs += [
        dict(model="mlp", fault="frozen_layers", onset=200),
        dict(model="cnn", fault="frozen_layers", onset=200, seed=1),
        dict(model="transformer", fault="frozen_layers", onset=150, batch=32, steps=450),
        dict(model="lstm", fault="frozen_layers", onset=200, batch=32, lr=3e-3, seed=1),
    ]
    for run in runs:
        if run["fault"] == "lr_ramp":
            run.setdefault("steps", 900)  # long enough to reach the blow-up
    return runs


def _name(run: dict[str, object]) -> str:
    kind = run.get("fault") or f"healthy-{run['trap']}"
    task = "-reg" if run.get("task") == REG else ""
    return f"{kind}-{run['model']}{task}-s{run.get('seed', 0)}"


def build_plan(quick: bool = False) -> list[RunSpec]:
    """All runs, writers rotated; `quick` keeps one run per (fault or trap, model), ≤ 400 steps.

    Runs that fake a wall-clock gap go to a writer that accepts a wall time.
    """
    specs: list[RunSpec] = []
    seen: set[tuple[object, object]] = set()
    writers = cycle(WRITERS)
    walltime_writers = cycle(sorted(TAKES_WALLTIME))
    for run in _healthy() + _faults():
        key = (run.get("fault") or run.get("trap"), run["model"])
        if quick and key in seen:
            continue
        seen.add(key)
        run = dict(run)
        hang = run.get("fault") == "loader_stall" and not run.get("duration")
        run["writer"] = next(walltime_writers) if hang else next(writers)
        run.setdefault("seed", 0)
        if quick and run.get("fault") != "lr_ramp":
            run["steps"] = min(int(run.get("steps", 600)), 400)
        specs.append(RunSpec(name=_name(run), **run))  # type: ignore[arg-type]
    names = [s.name for s in specs]
    assert len(names) == len(set(names)), "run names must be unique"
    return specs
