"""What a framework-shape run is: its shape, its trap or fault, and when the fault acts.

Steps are in each framework's own logged-step axis (HF and Keras count
optimizer updates from 1, Lightning and the plain loops from 0), so
`onset` and `crash_step` can be compared with the steps in the log files
without conversion. A shape's loss is logged at the last step of each
interval of `log_every` steps; onsets sit at the first step of an interval,
so the next logged point is the first abnormal one and is wholly abnormal.
"""

from __future__ import annotations

from dataclasses import dataclass

FAULTS = (
    "divergence",
    "level_shift",
    "lr_jump",
    "nan",
    "frozen_layers",
    "slowdown",
    "vanishing_gradients",
)
TRAPS = (
    "plain",
    "small_data_gap",
    "noisy_small_batch",
    "slow_finetune",
    "bursty_neighbour",
    "deep_batchnorm_sigmoid",
    "preln_transformer",
)


@dataclass(frozen=True)
class Shape:
    """One framework with one default-logging configuration."""

    framework: str  # "hf" | "lightning" | "keras" | "tb_tensor" | "tbx"
    log_every: int  # steps between logged training-loss points
    eval_every: int  # steps between evaluations
    steps: int
    step_base: int  # the step number of the first optimizer update
    logger: str = ""  # Lightning: "tb" | "csv"
    update_freq: str | int = "epoch"  # Keras TensorBoard callback
    steps_per_epoch: int = 0  # Keras: batches per epoch (0: not epoch-structured)
    # Lightning: the docs' recipe for watching gradients, `self.log_dict(grad_norm(self, 2))`
    # in on_before_optimizer_step: one series per parameter, written while it has a gradient
    grad_norms: bool = False
    # Lightning: the docs' LearningRateMonitor(logging_interval="step"), `lr-AdamW`, which
    # writes the lr at the start of a logging step's batch, before that step's loss
    lr_monitor: bool = False


SHAPES: dict[str, Shape] = {
    "hf500": Shape("hf", 500, 500, 7000, 1),
    "hf10": Shape("hf", 10, 100, 1500, 1),
    "hf50": Shape("hf", 50, 250, 3000, 1),
    "lightning50_tb": Shape("lightning", 50, 250, 2500, 0, logger="tb"),
    "lightning50_csv": Shape("lightning", 50, 250, 2500, 0, logger="csv"),
    "lightning1_tb": Shape("lightning", 1, 50, 600, 0, logger="tb"),
    "lightning10_tb": Shape("lightning", 10, 100, 1500, 0, logger="tb"),
    "lightning1_csv": Shape("lightning", 1, 50, 600, 0, logger="csv"),
    "lightning50_gradnorm_tb": Shape("lightning", 50, 250, 2500, 0, logger="tb", grad_norms=True),
    "lightning1_gradnorm_tb": Shape("lightning", 1, 50, 600, 0, logger="tb", grad_norms=True),
    "lightning50_lrmon_tb": Shape("lightning", 50, 250, 2500, 0, logger="tb", lr_monitor=True),
    "keras_epoch": Shape("keras", 50, 50, 2000, 1, update_freq="epoch", steps_per_epoch=50),
    "keras_batch10": Shape("keras", 10, 50, 1500, 1, update_freq=10, steps_per_epoch=50),
    "keras_batch": Shape("keras", 1, 50, 600, 1, update_freq="batch", steps_per_epoch=50),
    "tb_tensor": Shape("tb_tensor", 25, 100, 1500, 0),
    "tbx_tutorial_every": Shape("tbx", 1, 50, 600, 0),
}


@dataclass(frozen=True)
class ShapeRun:
    """One run of the framework-shapes corpus; `param`/`duration` mean what the fault says."""

    name: str
    shape: str
    seed: int = 0
    trap: str | None = None
    fault: str | None = None
    steps: int = 0
    batch: int = 8
    lr: float = 1e-3
    weight_decay: float = 0.0
    train_size: int = 4000
    width: int = 64
    model: str = "body"  # deep.model_of: "body", "deep_sigmoid", "deep_bn_sigmoid", ...
    onset: int | None = None
    param: float = 0.0
    duration: int = 0

    @property
    def spec(self) -> Shape:
        return SHAPES[self.shape]


def lr_factor(run: ShapeRun, step: int) -> float:
    """The multiplier a learning-rate fault puts on the framework's own schedule."""
    if run.onset is None or step < run.onset:
        return 1.0
    if run.fault in ("divergence", "lr_jump"):
        return run.param
    return 1.0


def label_noise(run: ShapeRun, step: int) -> float:
    """The share of a batch's labels a broken data pipeline replaces with random ones."""
    if run.fault == "level_shift" and run.onset is not None and step >= run.onset:
        return run.param
    return 0.0


def is_nan_step(run: ShapeRun, step: int) -> bool:
    return run.fault == "nan" and step == run.onset


def is_freeze_step(run: ShapeRun, step: int) -> bool:
    return run.fault == "frozen_layers" and step == run.onset


def is_slow_step(run: ShapeRun, step: int) -> bool:
    if run.fault != "slowdown" or run.onset is None:
        return False
    return run.onset <= step < run.onset + run.duration


# The least a step takes in the runs whose pace is judged (a slowdown, the bursty
# neighbour): the corpus's model takes 0.3-0.9 ms a step where real training takes
# milliseconds to seconds, and at 0.3 ms a slowdown of 300 steps ×5 is over in
# 0.5 s, before the 2 s the bench gives a page. At 2 ms it lasts 3 s on any machine.
PACE_FLOOR_S = 0.002


def paced(run: ShapeRun) -> bool:
    """Whether the run's steps are held to PACE_FLOOR_S."""
    return run.fault == "slowdown" or run.trap == "bursty_neighbour"


# A neighbour that takes the cores for 0.3 s of every second from the run's first
# second on, slowing the steps it overlaps ×4: what a shared training box does.
BURST_PERIOD_S, BURST_S, BURST_FACTOR, BURSTS_FROM_S = 1.0, 0.3, 4.0, 1.0


def in_burst(run: ShapeRun, elapsed: float) -> bool:
    """Whether the bursty neighbour of a run `elapsed` seconds in is taking the cores."""
    if run.trap != "bursty_neighbour" or elapsed < BURSTS_FROM_S:
        return False
    return elapsed % BURST_PERIOD_S < BURST_S


def on_epoch_axis(epoch_axis: object, run: str, tag: str) -> bool:
    """Whether a series counts epochs: Keras' epoch_* tags and its CSV (steps_per_epoch
    steps each, the last of them numbered (epoch + 1) × steps_per_epoch)."""
    if not isinstance(epoch_axis, dict):
        return False
    runs = epoch_axis.get("runs") or []
    return run in runs or tag.rsplit("/", 1)[-1].startswith(str(epoch_axis.get("tag_prefix")))
