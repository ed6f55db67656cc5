"""The default pack: each rule fires on its fault and the pack is quiet on healthy runs.

A synthetic run logs what the HF Trainer would (train/loss, eval/loss,
train/grad_norm, train/learning_rate, a step time) every 5 steps for 8000
steps: a noisy, decreasing loss, warm-up then cosine decay of the learning
rate. Each fault rewrites one part of it from step 4000 on.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from importlib.resources import files

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.probe_faults import FAULTS as PROBE_FAULTS
from support.probe_faults import PROBE_RULES
from support.series import WALL0

from trainsentry.backtest.replay import replay_transitions
from trainsentry.point import Point
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules
from trainsentry.rules.model import AcrossRanks, Checkpoints, CollectiveHang, Pattern, Restarts

# with the pack's one rule shipped off (val_loss_stagnation) switched on, as its file does
PACK = load_rules(["default", str(files("trainsentry") / "packs" / "early_stopping.yaml")])
ONSET = 4000
Series = dict[str, list[list[float]]]  # tag -> [[step, wall, value], ...]

HF = {
    "loss": "train/loss",
    "val": "eval/loss",
    "grad": "train/grad_norm",
    "lr": "train/learning_rate",
}
LIGHTNING = {"loss": "train_loss", "val": "val_loss", "grad": "grad_norm", "lr": "lr-AdamW"}
TUTORIAL = {"loss": "Loss/train", "val": "Loss/val", "grad": "Gradient/Norm", "lr": "lr"}
TBX = {"loss": "Loss/train", "val": "Loss/val", "grad": "Gradient/Norm", "lr": "LearningRate"}
KERAS = {
    "loss": "train/batch_loss",
    "val": "validation/epoch_loss",
    "grad": "train/batch_grad_norm",
    "lr": "train/batch_learning_rate",
}


def healthy(seed: int = 0, names: dict[str, str] = HF, steps: int = 8000) -> Series:
    rng = random.Random(seed)
    out: Series = {name: [] for name in (*names.values(), "step_time")}
    for s in range(0, steps + 1, 5):
        wall = WALL0 + 0.5 * s + rng.uniform(0, 0.05)
        clean = 0.5 + 2.5 * math.exp(-s / 2000)
        out[names["loss"]].append([s, wall, clean * (1 + rng.gauss(0, 0.08))])
        grad = 1.0 + 0.5 * math.exp(-s / 500) + abs(rng.gauss(0, 0.15))
        out[names["grad"]].append([s, wall, grad])
        warm = min(1.0, s / 500)
        cosine = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * s / steps))
        out[names["lr"]].append([s, wall, 1e-3 * warm * cosine])
        out["step_time"].append([s, wall, 0.5 + rng.gauss(0, 0.02)])
        if s % 200 == 0 and s:
            out[names["val"]].append([s, wall + 1, clean + 0.1 + rng.gauss(0, 0.005)])
    return out


def as_points(series: Series, run: str = "exp/seed0") -> list[Point]:
    return [Point(run, tag, int(s), w, v) for tag, rows in series.items() for s, w, v in rows]


def after(rows: list[list[float]], fn: Callable[[float, float], float], onset: int = ONSET) -> None:
    for row in rows:
        if row[0] >= onset:
            row[2] = fn(row[0] - onset, row[2])


def fault_loss_nan(run: Series) -> None:
    after(run["train/loss"], lambda d, v: math.nan, onset=6000)


def fault_grad_inf(run: Series) -> None:
    after(run["train/grad_norm"], lambda d, v: math.inf, onset=6000)


def fault_filtered_nan(run: Series) -> None:
    # HF's logging_nan_inf_filter: a wholly NaN interval's loss is logged as 0.0
    after(run["train/loss"], lambda d, v: 0.0, onset=6000)
    after(run["train/grad_norm"], lambda d, v: math.nan, onset=6000)


def fault_grad_exponential(run: Series) -> None:
    after(run["train/grad_norm"], lambda d, v: v * 1.08 ** (d / 5))


def fault_grad_jump(run: Series) -> None:
    after(run["train/grad_norm"], lambda d, v: 500.0 if d < 50 else v)


def fault_loss_spike(run: Series) -> None:
    after(run["train/loss"], lambda d, v: 4 * v if d == 0 else v)


def fault_loss_divergence(run: Series) -> None:
    after(run["train/loss"], lambda d, v: v * (1 + d / 100))


def fault_loss_runaway(run: Series) -> None:
    after(run["train/loss"], lambda d, v: v * 4 ** min(d / 5, 100))  # ×4 per logged point


def fault_loss_explosion(run: Series) -> None:
    after(run["train/loss"], lambda d, v: 1e5 * v)  # an lr jump: orders of magnitude at once


def fault_level_shift(run: Series) -> None:
    after(run["train/loss"], lambda d, v: 5 * v)  # a resume with the lr ×10: worse for good


def fault_epoch_level_shift(run: Series) -> None:
    """A custom loop's per-epoch mean (an epoch every 200 steps), ×5 from the onset."""
    run["train/epoch_loss"] = [
        [s, WALL0 + 0.5 * s, (5 if s >= ONSET else 1) * (0.5 + 2.5 * math.exp(-s / 2000))]
        for s in range(200, 8001, 200)
    ]


# Single-batch training losses as Lightning logs them by default, one every 50
# steps (a bench run, bench/corpus.py --shapes: lightning50_tb-level_shift): ×100
# apart around a near-zero level, then around a level ×10 up once 10 % of the
# labels went random. No point-wise rule tells that level from the noise.
LIGHTNING_BATCHES = [
    0.0406, 0.00721, 0.0544, 0.192, 0.0256, 0.157, 0.0321, 0.0544, 0.0045, 0.0427,
    0.00555, 0.108, 0.156, 0.0965, 0.00198, 0.131, 0.18, 0.167, 0.0618, 0.305,
]  # fmt: skip
LIGHTNING_SHIFTED = [
    0.554, 2.07, 0.702, 0.396, 0.836, 1.95, 0.684, 0.364, 0.85, 1.01, 1.35, 0.162,
    0.312, 0.18, 0.159, 0.896, 0.748, 0.58, 1.18, 0.95, 0.14, 0.212,
]  # fmt: skip


def fault_level_raised(run: Series) -> None:
    """The loss as Lightning's default logging writes it, shifted ×10 at the onset."""
    rows = [row for row in run["train/loss"] if row[0] % 50 == 0]
    for i, row in enumerate(rows):
        values = LIGHTNING_SHIFTED if row[0] >= ONSET else LIGHTNING_BATCHES
        row[2] = values[i % len(values)]
    run["train/loss"] = rows


def fault_val_explosion(run: Series) -> None:
    after(run["eval/loss"], lambda d, v: 1e4 * v)  # the weights wrecked between evaluations


def fault_lr_jump(run: Series) -> None:
    """A scheduler bug: the lr ×10⁴ at one step, and the loss of that record ×40."""
    after(run["train/learning_rate"], lambda d, v: 10.0)
    after(run["train/loss"], lambda d, v: 40 * v if d == 0 else math.nan)


def fault_loss_plateau(run: Series) -> None:
    level = 0.5 + 2.5 * math.exp(-ONSET / 2000)
    after(run["train/loss"], lambda d, v: level * (1 + random.Random(d).gauss(0, 0.08)))
    after(run["eval/loss"], lambda d, v: level + 0.1)


def fault_val_stagnation(run: Series) -> None:
    after(run["eval/loss"], lambda d, v: 0.9)


def fault_overfitting(run: Series) -> None:
    after(run["eval/loss"], lambda d, v: v + d / 2000)


def fault_memorising(run: Series) -> None:
    """Validation leaves its best for good while training goes on improving."""
    after(run["train/loss"], lambda d, v: 0.02)
    after(run["eval/loss"], lambda d, v: 2.0 * v + d / 2000)


def fault_memorising_gap(run: Series) -> None:
    """Training fitted to near zero, validation ~60 % above its best (0.94) and staying."""
    after(run["train/loss"], lambda d, v: 0.02)
    after(run["eval/loss"], lambda d, v: 1.5)


def fault_lr_zero(run: Series) -> None:
    after(run["train/learning_rate"], lambda d, v: 0.0)


def fault_vanishing(run: Series) -> None:
    after(run["train/grad_norm"], lambda d, v: 1e-7)


def fault_update_ratio(run: Series) -> None:
    run["probe/update_ratio"] = [
        [s, w, 1e-3 if s < ONSET else 1e-8] for s, w, _ in run["step_time"]
    ]


def fault_slow_steps(run: Series) -> None:
    for rows in run.values():
        for row in rows:
            if row[0] >= ONSET:
                row[1] += 3.0 * (row[0] - ONSET)  # 3.5 s per step instead of 0.5


def fault_slow_epochs(run: Series) -> None:
    """A custom loop's per-epoch mean beside its steps, every step ×7 slower from the onset."""
    fault_epoch_level_shift(run)
    run["train/epoch_loss"] = [[s, w, 1.0] for s, w, _ in run["train/epoch_loss"]]
    fault_slow_steps(run)


def fault_step_time(run: Series) -> None:
    after(run["step_time"], lambda d, v: 4 * v)


def fault_step_hang(run: Series) -> None:
    # one step hangs for 12 minutes, then the run carries on: under run_stalled's 15 min
    for rows in run.values():
        for row in rows:
            if row[0] >= ONSET:
                row[1] += 720.0


def fault_stall(run: Series) -> None:
    for rows in run.values():
        for row in rows:
            if row[0] >= ONSET:
                row[1] += 3600.0


def saving(run: Series, size: float = 4e9) -> None:
    """The run's checkpoints, every 500 steps, each complete a few seconds after its step."""
    for tag in ("checkpoint/step", "checkpoint/bytes", "checkpoint/files", "checkpoint/partial"):
        run[tag] = []
    for s in range(500, 8001, 500):
        wall = WALL0 + 0.5 * s + 3.0
        run["checkpoint/step"].append([s, wall, s])
        run["checkpoint/bytes"].append([s, wall, size])
        run["checkpoint/files"].append([s, wall, 6])
        run["checkpoint/partial"].append([s, wall, 0.0])


def fault_checkpoint_partial(run: Series) -> None:
    saving(run)
    run["checkpoint/partial"].append([6250, WALL0 + 0.5 * 6250 + 600, 1.0])
    run["checkpoint/partial"].sort(key=lambda row: row[1])


def fault_checkpoint_empty(run: Series) -> None:
    saving(run)
    after(run["checkpoint/bytes"], lambda d, v: 0.0, onset=6000)


def fault_checkpoint_shrank(run: Series) -> None:
    saving(run)
    after(run["checkpoint/bytes"], lambda d, v: v / 4, onset=6000)  # the optimizer state lost


def fault_checkpoint_disk(run: Series) -> None:
    saving(run)
    run["checkpoint/room"] = [
        [s, WALL0 + 0.5 * s + 60, max(1.0, 12 - s / 500)] for s in range(500, 8001, 500)
    ]


FAULTS = {
    "loss_non_finite": fault_loss_nan,
    "grad_norm_non_finite": fault_grad_inf,
    "loss_filtered_non_finite": fault_filtered_nan,
    "grad_norm_exponential_growth": fault_grad_exponential,
    "grad_norm_far_above_baseline": fault_grad_jump,
    "loss_spike": fault_loss_spike,
    "loss_divergence": fault_loss_divergence,
    "loss_runaway": fault_loss_runaway,
    "loss_plateau": fault_loss_plateau,
    "loss_explosion": fault_loss_explosion,
    "loss_level_shift": fault_level_shift,
    "loss_level_jump": fault_level_shift,  # the warning on its third point, the critical later
    "loss_level_raised": fault_level_raised,
    "val_loss_explosion": fault_val_explosion,
    "epoch_loss_level_shift": fault_epoch_level_shift,
    "lr_jump": fault_lr_jump,
    "val_loss_stagnation": fault_val_stagnation,
    "overfitting": fault_overfitting,
    "overfitting_severe": fault_memorising,
    "overfitting_gap": fault_memorising_gap,
    "lr_stuck_at_zero": fault_lr_zero,
    "vanishing_gradients": fault_vanishing,
    "update_ratio_collapsed": fault_update_ratio,
    "throughput_drop": fault_slow_steps,
    "step_time_increase": fault_step_time,
    "epoch_throughput_drop": fault_slow_epochs,
    "run_stalled": fault_stall,
    "step_stalled": fault_step_hang,
    "checkpoint_partial": fault_checkpoint_partial,
    "checkpoint_empty": fault_checkpoint_empty,
    "checkpoint_shrank": fault_checkpoint_shrank,
    "checkpoint_disk_room": fault_checkpoint_disk,
}


def test_every_rule_of_the_pack_has_a_fault_here() -> None:
    # the probe's rules read series this HF-style run does not log; their faults
    # live in support/probe_faults.py, on synthetic probe series (test_probe_rules.py)
    # pattern rules read text logs: their real messages are in rules/tests/text_logs_test.yaml;
    # the rules across a job's ranks and attempts need a job: theirs are in
    # test_rules_ranks.py, test_attempts.py and rules/tests/{ranks,restarts}_test.yaml;
    # a job's checkpoints against its records: rules/tests/checkpoints_test.yaml
    others = (Pattern, AcrossRanks, CollectiveHang, Restarts, Checkpoints)
    names = {r.name for r in PACK.rules if not isinstance(r.condition, others)}
    assert names - set(PROBE_RULES) == set(FAULTS)
    assert set(PROBE_RULES) <= names
    assert set(PROBE_FAULTS) == set(PROBE_RULES)
    assert not set(FAULTS) & set(PROBE_RULES)


@pytest.mark.parametrize("rule", sorted(FAULTS))
def test_each_default_rule_fires_on_its_fault_after_the_onset(rule: str) -> None:
    run = healthy(seed=7)
    FAULTS[rule](run)
    fired = [t for t in replay_transitions(as_points(run), PACK) if t.state == "firing"]
    mine = [t for t in fired if t.rule == rule]
    assert mine, f"{rule} did not fire; fired: {[(t.rule, t.step) for t in fired]}"
    assert mine[0].step >= ONSET - 200, mine[0].message
    assert mine[0].message and mine[0].runbook


@pytest.mark.parametrize("rule", sorted(FAULTS))
def test_messages_read_as_one_sentence_that_names_the_step_once(rule: str) -> None:
    run = healthy(seed=7)
    FAULTS[rule](run)
    fired = [t for t in replay_transitions(as_points(run), PACK) if t.state == "firing"]
    for t in (t for t in fired if t.rule == rule):
        if t.metric == "*":  # run-level: the silence is its subject
            assert t.message.startswith("no new data for "), t.message
            continue
        assert t.message.startswith(f"{t.canonical} at step {t.step} "), t.message
        assert "(step" not in t.message and ") (" not in t.message, t.message


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "names",
    [HF, LIGHTNING, TUTORIAL, TBX, KERAS],
    ids=["hf", "lightning", "tutorial", "tbx", "keras"],
)
def test_the_pack_is_quiet_on_a_healthy_noisy_decreasing_loss(
    seed: int, names: dict[str, str]
) -> None:
    got = replay_transitions(as_points(healthy(seed, names)), PACK)
    assert [(t.rule, t.step, t.message) for t in got] == []


def test_the_pack_is_quiet_on_a_healthy_run_that_checkpoints() -> None:
    run = healthy(seed=3)
    saving(run)
    assert [(t.rule, t.step) for t in replay_transitions(as_points(run), PACK)] == []


def test_exponential_gradient_growth_escalates_before_the_norm_passes_100() -> None:
    run = healthy(seed=3)
    fault_grad_exponential(run)
    got = [
        t for t in replay_transitions(as_points(run), PACK) if t.rule.startswith("grad_norm_exp")
    ]
    firing = [t for t in got if t.state == "firing"]
    assert [t.severity for t in firing] == ["warning", "critical"]
    crossing = next(s for s, _, v in run["train/grad_norm"] if v > 100)
    assert firing[1].step <= crossing - 10
    assert "projected to pass 100" in firing[1].message and firing[1].escalated_from == "warning"


def test_the_pack_catches_a_nan_logged_under_any_convention() -> None:
    for names in (HF, LIGHTNING, TUTORIAL):
        run = healthy(seed=1, names=names, steps=500)
        after(run[names["loss"]], lambda d, v: math.nan, onset=400)
        fired = {t.rule for t in replay_transitions(as_points(run), PACK) if t.state == "firing"}
        assert "loss_non_finite" in fired, names


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["train/loss", "eval/loss", "train/grad_norm", "lr", "step_time", "x"]),
            st.integers(-5, 400),
            st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.just(0.0)),
            st.one_of(st.floats(0, 1e4), st.just(math.nan)),
        ),
        max_size=300,
    )
)
def test_the_engine_never_crashes_on_odd_points(rows: list[tuple[str, int, float, float]]) -> None:
    engine = Engine(PACK)
    for tag, step, value, wall in rows:
        for t in engine.feed(Point("r", tag, step, WALL0 + wall, value)):
            json.dumps(t.as_dict(), allow_nan=False)
    engine.tick(WALL0 + 1e6)
    engine.finish_all()


def test_corrupted_batches_that_recover_stay_a_warning() -> None:
    # eight logged batches of garbage (loss ×30, one huge gradient), then the loss
    # comes back down over ~40 logged points: the run recovers by itself
    run = healthy(seed=4)
    after(run["train/loss"], lambda d, v: 30 * v if d < 40 else v * (1 + 3 * math.exp(-d / 60)))
    after(run["train/grad_norm"], lambda d, v: 800.0 if d == 0 else 30 * v if d < 40 else v)
    fired = [t for t in replay_transitions(as_points(run), PACK) if t.state == "firing"]
    assert [t.severity for t in fired if t.severity == "critical"] == []
    spikes = [(t.severity, t.step) for t in fired if t.rule == "loss_spike"]
    assert spikes == [("warning", ONSET)]  # one episode: no escalation


def test_a_single_bad_gradient_is_not_a_blow_up() -> None:
    run = healthy(seed=5)
    after(run["train/grad_norm"], lambda d, v: 900.0 if d == 0 else v)
    assert [t.rule for t in replay_transitions(as_points(run), PACK)] == []


def retimed(run: Series, seconds_per_step: Callable[[int], float]) -> None:
    """Re-stamp every series with a clock that advances `seconds_per_step(step)` per step."""
    wall, clock = WALL0, {}
    for step in range(0, 8001):
        clock[step] = wall
        wall += seconds_per_step(step)
    for rows in run.values():
        for row in rows:
            row[1] = clock[int(row[0])]


def test_the_pack_is_quiet_on_a_tiny_model_with_millisecond_jitter() -> None:
    # 3 ms per step, up to 1 ms of jitter each; every 1000 steps a neighbour takes the
    # core for 50 steps (11 ms a step): OS jitter, which persistence keeps quiet
    rng = random.Random(6)
    run = healthy(seed=6)
    retimed(run, lambda s: (0.011 if s % 1000 >= 950 else 0.003) + rng.uniform(0, 0.001))
    run["step_time"] = [[s, w, 0.003] for s, w, _ in run["step_time"]]
    assert [(t.rule, t.step) for t in replay_transitions(as_points(run), PACK)] == []


def test_a_starved_data_loader_of_a_fast_model_is_still_caught() -> None:
    run = healthy(seed=6)
    retimed(run, lambda s: 0.48 if ONSET <= s < ONSET + 600 else 0.06)
    fired = [t for t in replay_transitions(as_points(run), PACK) if t.state == "firing"]
    assert [(t.rule, t.severity) for t in fired] == [("throughput_drop", "warning")]
    assert ONSET < fired[0].step < ONSET + 200  # 100 steps of it, and the median's lag


def test_a_millisecond_model_five_times_slower_for_hundreds_of_steps_warns() -> None:
    """2 ms a step, then 10 ms for 400 steps: no absolute floor hides it."""
    rng = random.Random(3)
    run = healthy(seed=3)
    retimed(run, lambda s: (0.010 if ONSET <= s < ONSET + 400 else 0.002) + rng.uniform(0, 5e-4))
    run["step_time"] = [[s, w, 0.002] for s, w, _ in run["step_time"]]
    fired = [t for t in replay_transitions(as_points(run), PACK) if t.state == "firing"]
    assert [(t.rule, t.severity) for t in fired] == [("throughput_drop", "warning")]
    assert ONSET + 100 <= fired[0].step < ONSET + 200


def test_lr_at_zero_is_caught_under_tutorial_and_keras_names() -> None:
    for names in (TBX, KERAS):
        run = healthy(seed=2, names=names, steps=2000)
        after(run[names["lr"]], lambda d, v: 0.0, onset=1000)
        fired = {t.rule for t in replay_transitions(as_points(run), PACK) if t.state == "firing"}
        assert fired == {"lr_stuck_at_zero"}, names
