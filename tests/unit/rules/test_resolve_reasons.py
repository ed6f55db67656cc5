"""Why an alert resolves: "recovered" only when the series is back in the band it left.

Each condition kind whose quiet verdict can come while the series stays away
either keeps a firing alert firing there (baseline, jump) or resolves saying
where the series settled (growth, spike, pair). Through the engine, on series
written in the compact notation.
"""

from __future__ import annotations

import random

from support.series import evaluate, points, timeline

from trainsentry.alert import Transition


def resolves(transitions: list[Transition]) -> list[tuple[int, str | None]]:
    return [(t.step, t.reason) for t in transitions if t.state == "resolved"]


# --- baseline: held outside the band it left ---

LAYER = """
- name: far
  metric: grad_norm
  severity: critical
  baseline: {learn: 20 points, rolling: true, z_above: 20, ratio_above: 10}
"""
NORMAL = "(0.5 0.6 0.45 0.55 0.5)x3"  # 20 points: the layer's band is 0.45 to 0.6


def test_a_baseline_alert_under_its_line_but_far_from_its_band_stays_firing() -> None:
    # ×40 fires; ×8 is under the ×10 line, not back: held; 0.5 is back
    got = evaluate(LAYER, points(f"{NORMAL} 20 4 4 3 0.5", tag="grad_norm"))
    assert timeline(got) == [("firing", "critical", 20), ("resolved", "critical", 24)]
    assert resolves(got) == [(24, "recovered")]


def test_a_norm_that_stays_far_above_its_old_band_until_the_nan_never_recovers() -> None:
    got = evaluate(LAYER, points(f"{NORMAL} 20 4 6 8 nan nan", tag="grad_norm"), finish=True)
    assert resolves(got) == [(25, "run finished")]


def test_a_rolling_median_that_crept_up_under_a_growing_norm_does_not_make_it_back() -> None:
    # the norm creeps to ×2-3 (under the line, it joins the rolling baseline), pages at
    # ×28 of the crept median, then sits at ×8.5 of that median: far above where it was
    creep = "0.8 1 1.2 1.4 1.6 1.8 2 2.2 2.4 2.6"
    got = evaluate(LAYER, points(f"{NORMAL} {creep} 20 6 6 6", tag="grad_norm"), finish=True)
    assert timeline(got)[0][0] == "firing"
    assert resolves(got) == [(33, "run finished")]


def test_a_held_point_does_not_keep_a_pending_alert_going() -> None:
    rule = LAYER.replace("severity: critical", "severity: critical\n  for: 2 points")
    # hit, held, hit, held: never two hits in a row, never fired
    assert evaluate(rule, points(f"{NORMAL} 20 4 20 4 0.5", tag="grad_norm")) == []


def test_a_cancelled_streak_lets_go_of_its_band() -> None:
    rule = LAYER.replace("severity: critical", "severity: critical\n  for: 2 points")
    # one odd point, then the layer settles at 3 for good (its new normal, learned);
    # a blow-up from there pages and recovers back to 3, not to the 0.45-0.6 of before
    got = evaluate(rule, points(f"{NORMAL} 20 3x30 40 40 3", tag="grad_norm"))
    assert timeline(got) == [("firing", "critical", 53), ("resolved", "critical", 54)]
    assert resolves(got) == [(54, "recovered")]


def test_a_collapse_below_the_band_is_held_until_back_above_its_lowest() -> None:
    rule = "- {name: low, metric: g, baseline: {learn: 5 points, ratio_below: 0.01}}"
    got = evaluate(rule, points("1 1.1 0.9 1 1 0.001 0.5 0.95", tag="g"))
    assert timeline(got) == [("firing", "warning", 5), ("resolved", "warning", 7)]
    assert resolves(got) == [(7, "recovered")]


# --- pair: a jump holds until back under the highest it had ---

JUMP = "- {name: jump, metric: lr, severity: critical, pair: {other: loss, jump_from_max: 10}}"


def test_a_jumped_lr_that_its_schedule_decays_is_held_until_under_its_old_highest() -> None:
    # HF's linear decay after an lr ×100: 0.09 is under the jump's line (×10 the highest,
    # 0.1) but ×18 the 0.005 before the jump; 0.009 is back under the highest, 0.01
    lr = points("0.01 0.008 0.006 0.005 0.5 0.3 0.09 0.05 0.02 0.009", tag="lr")
    got = evaluate(JUMP, points("1x9", tag="loss"), lr)  # the loss first in each record, as HF
    assert timeline(got) == [("firing", "critical", 4), ("resolved", "critical", 9)]
    assert resolves(got) == [(9, "recovered")]


def test_a_jumped_lr_that_stays_up_resolves_only_when_the_run_ends() -> None:
    lr = points("0.01 0.008 0.006 0.005 0.5 0.3 0.09x4", tag="lr")
    got = evaluate(JUMP, points("1x10", tag="loss"), lr, finish=True)
    assert resolves(got) == [(10, "run finished")]


def test_after_a_jump_is_back_the_highest_moves_on_as_before() -> None:
    # back under 0.01 at step 5, then a schedule's ordinary rise to 0.02 is no new jump
    lr = points("0.01 0.01 0.5 0.05 0.009 0.02 0.02 0.15", tag="lr")
    got = evaluate(JUMP, points("1x7", tag="loss"), lr)
    assert timeline(got) == [("firing", "critical", 2), ("resolved", "critical", 4)]


OVERFIT = """
- name: overfit
  metric: val_loss
  pair: {other: loss, rise_from_best: 0.05, other_fall_since_best: 0.05, other_smoothing: 1}
"""


def test_an_overfit_validation_loss_that_stays_up_resolves_as_settled() -> None:
    # training falls, validation rises from its best 0.8; then training climbs back, so
    # the pair no longer holds, while validation stays ×1.12 its best
    train = points("1-0.05x10 0.8x5", tag="loss", every=10)
    val = points("1 0.9 0.8 0.82 0.86 0.9 0.9 0.9", tag="val_loss", every=20, start=5)
    got = evaluate(OVERFIT, train, val)
    assert timeline(got) == [("firing", "warning", 85), ("resolved", "warning", 125)]
    assert resolves(got) == [(125, "settled at a new level, ×1.12 the old (0.8 → 0.9)")]


def test_an_overfit_validation_loss_that_comes_back_resolves_as_recovered() -> None:
    train = points("1-0.05x10 0.5x5", tag="loss", every=10)
    val = points("1 0.9 0.8 0.82 0.86 0.9 0.8", tag="val_loss", every=20, start=5)
    got = evaluate(OVERFIT, train, val)
    assert resolves(got) == [(125, "recovered")]


# --- growth: stopped growing is not back ---

GROWTH = """
- name: boom
  metric: grad_norm
  growth: {window: 10 points, min_growth: 10, min_r2: 0.9}
  keep_firing_for: 5 points
"""


def test_a_norm_that_grew_and_stopped_there_resolves_as_settled() -> None:
    got = evaluate(GROWTH, points("1x20 1*1.5x12 100x20", tag="grad_norm"))
    (resolve,) = [t for t in got if t.state == "resolved"]
    assert resolve.reason is not None and resolve.reason.startswith("settled at a new level, ×")
    assert "→ 100)" in resolve.reason


def test_a_norm_that_grew_and_came_back_resolves_as_recovered() -> None:
    got = evaluate(GROWTH, points("1x20 1*1.5x12 1x20", tag="grad_norm"))
    assert [r for _, r in resolves(got)] == ["recovered"]


# --- spike: a spike that became a level is not back ---

SPIKE = "- {name: sp, metric: loss, spike: {window: 30, k: 6, warmup: 10}, keep_firing_for: 5}"


def noisy(n: int, level: float, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{level + rng.gauss(0, 0.05):.4f}" for _ in range(n))


def test_a_spike_that_comes_back_resolves_as_recovered() -> None:
    got = evaluate(SPIKE, points(f"{noisy(40, 2, 2)} 9 {noisy(20, 2, 3)}"))
    assert resolves(got) == [(45, "recovered")]


def test_a_spike_that_becomes_a_level_resolves_as_settled() -> None:
    # the loss jumps to 9 and stays: each point enters the window clipped at the limit,
    # which rises until 9 is no spike any more; the level is ×4.5 the old, not back
    got = evaluate(SPIKE, points(f"{noisy(40, 2, 2)} {noisy(60, 9, 4)}"))
    assert resolves(got) == [(50, "settled at a new level, ×4.53 the old (1.978 → 8.965)")]


# --- the kinds whose quiet is their band ---


def test_a_threshold_resolves_as_recovered_under_its_resolve_level() -> None:
    rule = "- {name: hot, metric: loss, threshold: {above: 10, resolve_below: 5}}"
    assert resolves(evaluate(rule, points("1 11 9 4"))) == [(3, "recovered")]
