"""The framework-shapes corpus: every shape gets the same healthy traps and faults.

Healthy traps are what a default pack meets on day one: a plain run; a
small-data classifier whose training loss is near zero while its validation
loss sits tens of times higher and still at its best (the normal gap, with
weight decay holding validation flat); small noisy batches; a slow
fine-tune from a pretrained body at a tenth of the lr; a bursty neighbour
that slows every step ×4 for 0.3 s of each second (OS jitter at its worst:
a slowdown warning per burst is noise, not news). Fault strengths were
tried on this task (clusters, best loss ~0.05): lr ×100 on Adam collapses
the net to chance and it stays there (~30-50× its best, never NaN); 10% of
labels replaced by random ones lifts the loss ~×5 for good; lr ×10⁴ blows
the loss past 10⁴× its start in one step; one NaN activation poisons the
weights; freezing all but the head stops learning without a jump; a sleep
makes every step ×5 slower for at least six logging intervals.

Shapes that log per-layer gradient norms (Lightning's grad_norm recipe) also
train deep networks (deep.py): a 16-deep sigmoid stack without normalisation,
whose first layers get 1e-14 of the head's gradient from step 0 (the
vanishing-gradients fault, onset at the first step), and two healthy deep
networks beside it, the same stack with BatchNorm and a small pre-LN
transformer. Shapes without per-layer series do not get them: nothing they
log would show it.
"""

from __future__ import annotations

from corpusgen.shapes.spec import SHAPES, ShapeRun

TRAP_ARGS: dict[str, dict[str, object]] = {
    "plain": {},
    "small_data_gap": {"train_size": 300, "width": 128, "weight_decay": 0.5, "batch": 16},
    "noisy_small_batch": {"batch": 2},
    "slow_finetune": {"lr": 1e-4},
    "bursty_neighbour": {},
}
# only where per-layer gradient norms are logged (Shape.grad_norms)
LAYER_TRAP_ARGS: dict[str, dict[str, object]] = {
    "deep_batchnorm_sigmoid": {"model": "deep_bn_sigmoid"},
    "preln_transformer": {"model": "preln_transformer"},
}
LAYER_FAULT_MODEL = {"vanishing_gradients": "deep_sigmoid"}
FAULT_PARAM = {
    "divergence": 100.0,
    "level_shift": 0.1,
    "lr_jump": 1e4,
    "nan": 0.0,
    "frozen_layers": 0.0,
    "slowdown": 5.0,
}


def _onset(shape: str, steps: int) -> int:
    """The first step of the logging interval half way through the run."""
    spec = SHAPES[shape]
    return spec.step_base + spec.log_every * round(0.5 * steps / spec.log_every)


def build_plan(quick: bool = False, shapes: list[str] | None = None) -> list[ShapeRun]:
    """Every shape × (traps + faults); `quick`: a plain run and a divergence, half as long."""
    runs: list[ShapeRun] = []
    for shape in shapes or list(SHAPES):
        spec = SHAPES[shape]
        steps = spec.steps // 2 if quick else spec.steps
        traps = ["plain"] if quick else list(TRAP_ARGS)
        faults = ["divergence"] if quick else list(FAULT_PARAM)
        if spec.grad_norms and not quick:
            traps += list(LAYER_TRAP_ARGS)
            faults += list(LAYER_FAULT_MODEL)
        for trap in traps:
            args = TRAP_ARGS[trap] if trap in TRAP_ARGS else LAYER_TRAP_ARGS[trap]
            runs.append(ShapeRun(f"{shape}-healthy-{trap}", shape, trap=trap, steps=steps, **args))  # type: ignore[arg-type]
        for fault in faults:
            when: dict[str, object]
            if fault in LAYER_FAULT_MODEL:  # from the first step
                when = {"onset": spec.step_base, "model": LAYER_FAULT_MODEL[fault]}
            else:
                onset = _onset(shape, steps)
                duration = 0
                if fault == "slowdown":
                    duration = min(max(300, 6 * spec.log_every), steps - onset)
                when = {"onset": onset, "param": FAULT_PARAM[fault], "duration": duration}
            runs.append(ShapeRun(f"{shape}-{fault}", shape, fault=fault, steps=steps, **when))  # type: ignore[arg-type]
    names = [r.name for r in runs]
    assert len(names) == len(set(names)), "run names must be unique"
    return runs
