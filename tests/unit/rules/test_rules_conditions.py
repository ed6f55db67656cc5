"""Every condition kind, through the engine, on series written in the compact notation."""

from __future__ import annotations

import math
import random
from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.series import WALL0, evaluate, points, ruleset, timeline

from trainsentry.point import Point
from trainsentry.rules.condition import SpanWindow
from trainsentry.rules.loader import RuleFileError
from trainsentry.rules.model import Growth, Span
from trainsentry.rules.pattern import GrowthCondition
from trainsentry.rules.window import BucketWindows

# --- layer 1 ---


def test_non_finite_fires_on_nan_and_resolves_when_values_are_finite_again() -> None:
    rules = """
    - name: nf
      metric: loss
      severity: critical
      non_finite: {}
    """
    got = evaluate(rules, points("1 2 nan inf 3"))
    assert timeline(got) == [("firing", "critical", 2), ("resolved", "critical", 4)]
    assert got[0].message == "loss at step 2 is nan"


def test_threshold_with_hysteresis_resolves_only_under_the_resolve_level() -> None:
    rules = """
    - name: hot
      metric: loss
      threshold: {above: 10, resolve_below: 5}
    """
    got = evaluate(rules, points("1 11 9 6 5 4 12"))
    assert timeline(got) == [
        ("firing", "warning", 1),
        ("resolved", "warning", 5),
        ("firing", "warning", 6),
    ]


def test_threshold_below_and_its_critical_level_escalate_one_alert() -> None:
    rules = """
    - name: cold
      metric: loss
      threshold: {below: 1, critical_below: 0.1}
    """
    got = evaluate(rules, points("2 0.5 0.05 2"))
    assert timeline(got) == [
        ("firing", "warning", 1),
        ("firing", "critical", 2),
        ("resolved", "critical", 3),
    ]
    assert got[1].escalated_from == "warning"


def test_threshold_ignores_nan_instead_of_resolving_on_it() -> None:
    got = evaluate("- {name: t, metric: loss, threshold: {above: 1}}", points("5 nan 5 0"))
    assert timeline(got) == [("firing", "warning", 0), ("resolved", "warning", 3)]


# --- layer 2: windows ---


def test_plateau_by_window_means_fires_when_the_loss_stops_improving() -> None:
    rules = """
    - name: flat
      metric: loss
      plateau: {window: 10 steps, min_improvement: 0.01}
    """
    # falls 1 % per step for 30 steps, then stays flat
    falling = " ".join(f"{100 * 0.99**i:.6f}" for i in range(30))
    got = evaluate(rules, points(falling + " 74x30"))
    first = timeline(got)[0]
    assert first[0] == "firing" and 40 <= first[2] <= 50
    assert "improved" in got[0].message and "over the last 10 steps" in got[0].message


def test_plateau_stays_quiet_while_a_noisy_loss_keeps_falling() -> None:
    rng = random.Random(3)
    noisy = " ".join(f"{5 * math.exp(-i / 200) + rng.gauss(0, 0.1):.5f}" for i in range(400))
    rules = "- {name: flat, metric: loss, plateau: {window: 50 steps, min_improvement: 0.01}}"
    assert evaluate(rules, points(noisy)) == []


def test_plateau_best_is_early_stopping_over_evaluations() -> None:
    rules = """
    - name: stagnant
      metric: val_loss
      plateau: {window: 3 points, min_delta: 0.001, method: best}
    """
    got = evaluate(rules, points("1 0.9 0.8 0.7995 0.7999 0.8 0.7 ", tag="val_loss", every=100))
    assert timeline(got) == [("firing", "warning", 500), ("resolved", "warning", 600)]
    assert "on its best 0.8, from step 200, for 3 points" in got[0].message


def test_rise_fires_when_the_smoothed_level_triples_its_best() -> None:
    rules = "- {name: up, metric: loss, severity: critical, rise: {factor: 3, smoothing: 3}}"
    got = evaluate(rules, points("2x10 1x10 2+1x10"))
    assert timeline(got)[0][:2] == ("firing", "critical")
    assert "its best 1" in got[0].message


def test_rise_ignores_a_single_spike() -> None:
    rules = "- {name: up, metric: loss, rise: {factor: 3, smoothing: 10}}"
    assert evaluate(rules, points("1x20 9 1x20")) == []


def test_rise_over_a_step_window_compares_window_means_with_the_lowest() -> None:
    rules = """
    - name: up
      metric: loss
      rise: {factor: 3, window: 100 steps, min_delta: 0.05}
    """
    # every 10 steps: the mean of the last 100 steps passes ×3 its best (0.5) once
    # 7 of its 10 points are at 2 ((3 × 0.5 + 7 × 2) / 10 = 1.55); under it again at 550
    got = evaluate(rules, points("1x9 0.5x20 2x20 0.5x20", every=10))
    assert timeline(got) == [("firing", "warning", 370), ("resolved", "warning", 550)]
    assert "mean over the last 100 steps (1.55) is ×3.1 the lowest" in got[0].message


def test_rise_over_a_step_window_means_the_same_stretch_at_any_cadence() -> None:
    rules = "- {name: up, metric: loss, rise: {factor: 3, window: 1000 steps}}"
    # one wild batch a window is averaged away at every step and at every 50
    for every in (1, 50):
        n = 4000 // every
        noisy = " ".join("20" if i % (1000 // every) == 7 else "0.5" for i in range(n))
        assert evaluate(rules, points(noisy, every=every)) == [], every


def test_rise_window_and_smoothing_do_not_mix() -> None:
    with pytest.raises(RuleFileError, match="a `window` mean or an EWMA"):
        ruleset("- {name: up, metric: loss, rise: {factor: 3, window: 1000 steps, smoothing: 5}}")


def test_pair_flags_validation_rising_while_training_falls() -> None:
    rules = """
    - name: overfit
      metric: val_loss
      pair: {other: loss, rise_from_best: 0.05, other_fall_since_best: 0.05, other_smoothing: 1}
    """
    train = points("1-0.05x10", tag="loss", every=10)
    val = points("1 0.9 0.8 0.82 0.86 0.9", tag="val_loss", every=20, start=5)
    got = evaluate(rules, train, val)
    assert timeline(got) == [("firing", "warning", 85)]
    assert "up 7.5% from its best 0.8" in got[0].message and "loss down" in got[0].message


def test_pair_ratio_with_an_extra_condition_on_the_other_series() -> None:
    rules = """
    - name: memorise
      metric: val_loss
      severity: critical
      pair: {other: loss, ratio_above: 5, other_below: 0.1, other_smoothing: 1}
    """
    train = points("1 0.5 0.2 0.05 0.05", tag="loss", every=10)
    val = points("1 1 1 1 0.2", tag="val_loss", every=10, start=1)
    assert timeline(evaluate(rules, train, val)) == [
        ("firing", "critical", 31),
        ("resolved", "critical", 41),
    ]


def test_pair_waits_for_the_other_series() -> None:
    rules = "- {name: p, metric: val_loss, pair: {other: loss, ratio_above: 2}}"
    assert evaluate(rules, points("5 5 5", tag="val_loss")) == []


def test_baseline_z_score_against_the_runs_own_early_history() -> None:
    rules = """
    - name: far
      metric: grad_norm
      severity: critical
      baseline: {learn: 20 points, skip: 2 points, z_above: 10, value_above: 5}
    """
    rng = random.Random(1)
    normal = " ".join(f"{1 + rng.gauss(0, 0.05):.4f}" for _ in range(30))
    got = evaluate(rules, points(f"50 40 {normal} 3 8 1", tag="grad_norm"))
    # 3 is far above the baseline but under the absolute ceiling; 8 is both
    assert timeline(got) == [("firing", "critical", 33), ("resolved", "critical", 34)]
    assert "median 1" in got[0].message and "robust z" in got[0].message


def test_baseline_ratio_below_catches_a_collapse_to_a_fraction_of_normal() -> None:
    rules = "- {name: low, metric: g, baseline: {learn: 5 points, ratio_below: 0.01}}"
    got = evaluate(rules, points("1x5 0.5 0.001 1", tag="g"))
    assert timeline(got) == [("firing", "warning", 7), ("resolved", "warning", 8)]


@pytest.mark.parametrize(
    ("limits", "fires_on"),
    [
        ("z_above: 5, ratio_above: 2, value_above: 2.5", ["3"]),  # every limit passed
        ("z_above: 5, ratio_above: 2, value_above: 3.5", []),  # one missed: no alarm
        ("z_below: -5, ratio_below: 0.5, value_below: 0.1", ["0.05"]),
        ("z_below: -5, ratio_below: 0.01, value_below: 0.1", []),
        ("z_above: 5, z_below: -5", []),  # both sides at once: nothing passes
    ],
)
def test_baseline_fires_only_when_every_limit_it_sets_is_passed(
    limits: str, fires_on: list[str]
) -> None:
    rules = f"- {{name: b, metric: g, baseline: {{learn: 5 points, {limits}}}}}"
    got = evaluate(rules, points("1 1.01 0.99 1 1.02 3 1 0.05 1", tag="g"))
    assert [t.value for t in got if t.state == "firing"] == [float(v) for v in fires_on]


def test_throughput_from_the_clock_fires_on_a_lasting_slowdown_not_on_one_pause() -> None:
    rules = """
    - name: slow
      metric: loss
      throughput: {slowdown: 3, learn: 10, skip: 0, recent: 3}
    """
    fast = points("1x20", seconds_per_step=1.0)
    pause = [p._replace(wall_time=p.wall_time + 100) for p in points("1x5", start=21)]
    assert evaluate(rules, fast + pause) == []
    slow = [
        p._replace(wall_time=fast[-1].wall_time + 5 * (p.step - 20))
        for p in points("1x10", start=21)
    ]
    got = evaluate(rules, fast + slow)
    assert timeline(got) == [("firing", "warning", 22)]  # 2 of the last 3 intervals are slow
    assert "×5 the run's baseline 1s/step" in got[0].message


def test_throughput_from_a_step_time_metric() -> None:
    rules = """
    - name: s
      metric: step_time
      throughput: {slowdown: 2, source: step_time, learn: 5, skip: 0, recent: 1}
    """
    got = evaluate(rules, points("0.1x5 0.1 0.5 0.1", tag="step_time"))
    assert timeline(got) == [("firing", "warning", 7), ("resolved", "warning", 8)]


def paced(spec: str, seconds: list[float], tag: str = "loss", start: int = 0) -> list[Point]:
    """Points whose wall times advance by the given seconds per step (one entry per step)."""
    out = points(spec, tag=tag, start=start)
    wall = out[0].wall_time
    for i, p in enumerate(out):
        wall += seconds[i] if i else 0.0
        out[i] = p._replace(wall_time=wall)
    return out


PACE = """
- name: slow
  metric: loss
  throughput: {slowdown: 3, min_increase: 0.05, learn: 20, skip: 0, recent: 5}
"""


def test_throughput_ignores_millisecond_jitter() -> None:
    # a tiny model: 3 ms per step, then 40 steps at 10 ms while a neighbour holds the core
    jitter = paced("1x80", [0.003] * 40 + [0.010] * 41)
    assert evaluate(PACE, jitter) == []
    # the same ×3.3 at a pace people notice (0.1 s → 0.33 s per step) is a slowdown
    human = paced("1x80", [0.1] * 40 + [0.33] * 41)
    assert timeline(evaluate(PACE, human))[0] == ("firing", "warning", 42)


def test_throughput_still_sees_a_starved_loader_on_a_fast_model() -> None:
    # 60 ms per step, then every step waits 8× as long on its batch
    got = evaluate(PACE, paced("1x80", [0.06] * 40 + [0.48] * 41))
    assert timeline(got)[0] == ("firing", "warning", 42)
    assert "advances at 0.48s/step" in got[0].message and "+0.05s/step" in got[0].message


def test_throughput_shares_one_wall_stamp_among_the_steps_it_covers() -> None:
    # whole-second stamps (a JSONL logger writing `time` as an integer) at 0.25 s per step:
    # four steps share each stamp; per-point intervals would read 0, 0, 0, 1 s/step
    rules = "- {name: slow, metric: loss, throughput: {slowdown: 3, learn: 20, skip: 0}}"
    steady = [p._replace(wall_time=float(int(p.wall_time))) for p in points("1x200")]
    assert evaluate(rules, paced_seconds(steady, 0.25)) == []
    slower = paced_seconds(steady, 0.25, after=100, slow=1.5)
    got = evaluate(rules, slower)
    assert got and got[0].state == "firing" and 100 < got[0].step < 130
    assert "the run's baseline 0.25s/step" in got[0].message


def paced_seconds(
    pts: list[Point], per_step: float, after: int = 10**9, slow: float = 0.0
) -> list[Point]:
    """Wall stamps truncated to whole seconds at `per_step`, then `slow` s/step after `after`."""
    out, wall = [], WALL0
    for p in pts:
        wall += per_step if p.step <= after else slow
        out.append(p._replace(wall_time=float(int(wall))))
    return out


def test_a_single_long_pause_is_judged_alone_with_recent_1_and_min_gap() -> None:
    rules = """
    - name: hung
      metric: loss
      throughput: {slowdown: 100, min_gap: 10m, learn: 20, skip: 0, recent: 1}
    """
    pause = [1.0] * 30 + [700.0] + [1.0] * 10  # one 11m40s pause before step 30
    got = evaluate(rules, paced("1x40", pause))
    assert timeline(got) == [("firing", "warning", 30), ("resolved", "warning", 31)]
    assert got[0].message.startswith("loss at step 30 came 11m40s after step 29")
    # five minutes is an evaluation or a checkpoint, not a hang
    assert evaluate(rules, paced("1x40", [1.0] * 30 + [300.0] + [1.0] * 10)) == []


def test_min_gap_is_a_time_on_the_clock() -> None:
    bad = (
        "- {name: g, metric: step_time, throughput: {slowdown: 2, source: step_time, min_gap: 60s}}"
    )
    with pytest.raises(RuleFileError, match="needs `source: clock`"):
        ruleset(bad)
    with pytest.raises(RuleFileError, match="a gap is a time"):
        ruleset("- {name: g, metric: loss, throughput: {slowdown: 2, min_gap: 5 steps}}")


def test_no_data_fires_at_the_deadline_and_resolves_when_data_resumes() -> None:
    rules = "- {name: stalled, no_data: {factor: 10, min_silence: 60s}}"
    before = points("1x20", seconds_per_step=10.0)  # steps 0..20, 10 s apart: waits 100 s
    after = points("1", start=40, seconds_per_step=10.0)
    got = evaluate(rules, before, after)
    assert [(t.state, t.step, t.wall_time - before[-1].wall_time) for t in got] == [
        ("firing", 20, 100.0),
        ("resolved", 40, 200.0),
    ]
    assert got[0].metric == "*" and "no new data for 100s after step 20" in got[0].message
    assert got[1].reason == "data resumed"


def test_no_data_never_waits_less_than_the_writers_flush_buffer() -> None:
    # a fast job (0.1 s per step) whose writer flushed after 120 s: not a stall
    rules = "- {name: stalled, no_data: {}}"
    fast = points("1x100", seconds_per_step=0.1)
    late = points("1", start=1300, seconds_per_step=0.1)
    assert evaluate(rules, fast, late) == []


# --- layer 3: patterns ---


def test_growth_projects_the_step_at_which_the_threshold_will_be_crossed() -> None:
    rules = """
    - name: boom
      metric: grad_norm
      growth:
        {window: 10 points, min_growth: 4, min_r2: 0.9, threshold: 1000, critical_within: 30 steps}
    """
    got = evaluate(rules, points("1x20 1*1.5x20", tag="grad_norm", every=5))
    assert [t.severity for t in got] == ["warning", "critical"]
    warn, crit = got
    # ×1.5 per 5 steps: 1000 is passed at 1.5^k ≥ 1000 → k = 18, i.e. step 100 + 90
    assert warn.state == "firing" and "R² 0.9" in warn.message
    assert "projected to pass 1000 in ~" in warn.message
    ahead = float(crit.message.split("in ~")[1].split()[0])
    assert abs(crit.step + ahead - 190) <= 1 and ahead <= 30


def test_growth_ignores_noise_and_slow_drift() -> None:
    rng = random.Random(5)
    noisy = " ".join(f"{abs(1 + 0.002 * i + rng.gauss(0, 0.3)):.4f}" for i in range(300))
    rules = "- {name: boom, metric: g, growth: {window: 30 points, min_growth: 4}}"
    assert evaluate(rules, points(noisy, tag="g")) == []


def test_spike_sigma_fires_on_the_spike_and_resolves_after() -> None:
    rng = random.Random(2)
    noisy = " ".join(f"{2 + rng.gauss(0, 0.05):.4f}" for _ in range(40))
    rules = "- {name: sp, metric: loss, spike: {window: 30, k: 6, warmup: 10}}"
    got = evaluate(rules, points(f"{noisy} 9 2 2"))
    assert timeline(got) == [("firing", "warning", 40), ("resolved", "warning", 41)]
    assert "jumped to 9" in got[0].message


def test_spike_on_a_flat_series_needs_the_minimum_ratio() -> None:
    rules = "- {name: sp, metric: loss, spike: {window: 10, k: 3, warmup: 5, min_ratio: 1.5}}"
    assert evaluate(rules, points("1x20 1.2 1x5")) == []


def test_spike_ewma_compares_fast_and_slow_averages() -> None:
    rules = (
        "- {name: sp, metric: loss, spike: {method: ewma, fast: 2, slow: 50, ratio: 2, warmup: 10}}"
    )
    got = evaluate(rules, points("1x30 5 5 1x20"))
    assert timeline(got)[0] == ("firing", "warning", 31)


def test_repeated_spikes_within_the_window_escalate_to_critical() -> None:
    rules = """
    - name: sp
      metric: loss
      spike: {window: 20, k: 5, warmup: 10, repeat: {count: 3, within: 100 steps}}
      keep_firing_for: 50 steps
    """
    base = "1 1.1 " * 10
    got = evaluate(rules, points(f"{base} 5 {base} 5 {base} 5 {base}"))
    assert timeline(got) == [("firing", "warning", 20), ("firing", "critical", 62)]
    assert "3 spike episodes within 100 steps" in got[1].message


def test_spike_episode_counts_once() -> None:
    # eight bad batches in a row, then normal: one event, not eight spikes
    rules = """
    - name: sp
      metric: loss
      spike: {window: 20, k: 5, warmup: 10, repeat: {count: 3, within: 100 steps}}
      keep_firing_for: 50 steps
    """
    base = "1 1.1 " * 10
    got = evaluate(rules, points(f"{base} 30x7 {base}"))
    assert timeline(got) == [("firing", "warning", 20)]
    assert "episodes" not in got[0].message


def test_spike_episodes_need_settle_points_back_within_normal_between_them() -> None:
    rules = """
    - name: sp
      metric: loss
      spike: {window: 20, k: 5, warmup: 10, settle: 3, repeat: {count: 2, within: 100 steps}}
      keep_firing_for: 50 steps
    """
    base = "1 1.1 " * 10
    # two normal points between the bad batches: still the same episode
    assert timeline(evaluate(rules, points(f"{base} 9 1 1 9 {base}"))) == [
        ("firing", "warning", 20)
    ]
    # three: a second episode, and two within 100 steps escalate
    got = evaluate(rules, points(f"{base} 9 1 1 1 9 {base}"))
    assert timeline(got) == [("firing", "warning", 20), ("firing", "critical", 24)]
    assert "2 spike episodes within 100 steps" in got[1].message


RISE = """
- name: up
  metric: loss
  severity: critical
  rise: {factor: 3, smoothing: 20, recovery: 0.25}
  for: 12 points
"""


def test_divergence_ignores_a_burst_of_bad_batches_that_recovers() -> None:
    # eight batches at ×30, then the loss comes back down over 30 steps
    burst = points("1x40 30x7 3-0.07x30 1x20")
    assert evaluate(RISE, burst) == []
    # without the recovery test the lagging EWMA keeps it "high" long enough to page
    plain = RISE.replace(", recovery: 0.25", "")
    assert timeline(evaluate(plain, burst))[0][:2] == ("firing", "critical")


def test_divergence_with_recovery_still_fires_on_a_steady_rise_and_a_high_plateau() -> None:
    ramp = evaluate(RISE, points("1x40 1+0.2x60"))
    assert timeline(ramp)[0][:2] == ("firing", "critical")
    assert (
        "is rising: its smoothed level" in ramp[0].message
        and "its best 1, from step" in ramp[0].message
    )
    plateau = evaluate(RISE, points("1x40 20x40"))
    assert timeline(plateau)[0][:2] == ("firing", "critical")


# --- the incremental machinery agrees with a recomputation ---


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=200), st.integers(1, 20))
def test_span_window_sums_match_the_window_recomputed(xs: list[float], n: int) -> None:
    window = SpanWindow(Span(n, "points"))
    for i, x in enumerate(xs):
        window.push(i, x)
    kept = xs[-n:]
    assert math.isclose(window.sum, math.fsum(kept), abs_tol=1e-6)
    assert math.isclose(window.mean(), sum(kept) / len(kept), rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0.01, 100), min_size=12, max_size=80),
    st.integers(5_000_000, 9_000_000),
)
def test_growth_fit_matches_a_batch_least_squares_even_at_large_steps(
    ys: list[float], origin: int
) -> None:
    cond = GrowthCondition(Growth(window=Span(10, "points"), min_points=3))
    for i, y in enumerate(ys):
        cond.update(origin + 7 * i, 0.0, y, None)  # type: ignore[arg-type]
    xs = [origin + 7 * i for i in range(len(ys))][-10:]
    ls = [math.log(y) for y in ys][-10:]
    mx, my = sum(xs) / 10, sum(ls) / 10
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ls, strict=True)) / sxx
    assert cond.fit is not None
    assert math.isclose(cond.fit[0], slope, rel_tol=1e-6, abs_tol=1e-9)


def test_a_sustained_blow_up_does_not_become_its_own_rolling_baseline() -> None:
    rule = """
    - name: layer_far_above
      tag: g
      severity: critical
      baseline: {learn: 20 points, rolling: true, ratio_above: 10}
    """
    got = evaluate(rule, points("1x39 40x40", tag="g"))
    assert [(t.state, t.step) for t in got] == [("firing", 40)]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["steps", "seconds", "points"]),
    st.floats(min_value=1, max_value=40),
    st.lists(st.tuples(st.floats(-5, 30), st.floats(-1e3, 1e3)), max_size=120),
)
def test_a_span_window_keeps_exactly_the_points_a_deque_of_them_would(
    unit: str, amount: float, pushes: list[tuple[float, float]]
) -> None:
    """The window is two arrays cut from the front; the reference is the deque of
    (position, value) it replaced, evicting from the front while the front is old
    (positions may go back: a wall clock set back)."""
    window = SpanWindow(Span(amount, unit))
    ref: deque[tuple[float, float]] = deque()
    position = 0.0
    for gap, value in pushes:
        position += gap
        window.push(position, value)
        ref.append((position, value))
        while ref and (ref[0][0] <= position - amount if unit != "points" else len(ref) > amount):
            ref.popleft()
        assert window.items == list(ref) and len(window) == len(ref)
        assert window.mean() == pytest.approx(
            sum(v for _, v in ref) / len(ref) if ref else math.nan, rel=1e-9, abs=1e-6, nan_ok=True
        )


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["steps", "points"]),
    st.integers(min_value=1, max_value=40),
    st.lists(st.tuples(st.sampled_from([0, 1, 1, 1]), st.floats(-1e3, 1e3)), max_size=160),
)
def test_plateau_windows_up_to_255_steps_are_exact(
    unit: str, amount: int, pushes: list[tuple[int, float]]
) -> None:
    """A bucket per step or point: the same points as the two span windows a plateau
    kept before (the recent one pushing what it dropped into the older one), for a
    loss logged at every step (repeats included)."""
    span = Span(amount, unit)
    windows = BucketWindows(span)
    recent, older = SpanWindow(span), SpanWindow(span)
    position = 0
    for index, (gap, value) in enumerate(pushes, start=1):
        position += gap
        at = float(position if unit == "steps" else index)
        windows.push(at, value)
        before = recent.items
        recent.push(at, value)
        for p, v in before[: len(before) + 1 - len(recent)]:  # what fell out of recent
            older.push(p, v)
        assert (windows.recent_count, windows.older_count) == (len(recent), len(older))
        assert windows.recent_mean() == pytest.approx(recent.mean(), rel=1e-9, nan_ok=True)
        assert windows.older_mean() == pytest.approx(older.mean(), rel=1e-9, nan_ok=True)


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from(["steps", "seconds", "points"]),
    st.floats(min_value=1, max_value=5000),
    st.lists(st.tuples(st.floats(-50, 400), st.floats(-1e3, 1e3)), max_size=200),
)
def test_plateau_windows_hold_the_buckets_their_definition_names(
    unit: str, amount: float, pushes: list[tuple[float, float]]
) -> None:
    """Recomputed from every point pushed: a point's bucket is floor(position / width),
    never before the previous point's (a clock set back); recent holds the points of
    buckets within `reach` of the newest bucket, older those within `reach` more."""
    windows = BucketWindows(Span(amount, unit))
    width, reach = windows.width, windows.reach
    if unit != "seconds":
        assert width >= 1 and width == int(width) and width <= max(1, amount // 128)
        assert amount % width == 0 or amount != int(amount)
        assert amount - width <= reach * width <= amount * (1 + 1e-12)
    seen: list[tuple[float, float]] = []  # (bucket, value)
    position = 0.0
    for index, (gap, value) in enumerate(pushes, start=1):
        position += gap
        at = position if unit != "points" else float(index)
        windows.push(at, value)
        key = max(math.floor(at / width), seen[-1][0] if seen else -math.inf)
        seen.append((key, value))
        newest = seen[-1][0]
        want_recent = [v for k, v in seen if k > newest - reach]
        want_older = [v for k, v in seen if newest - 2 * reach < k <= newest - reach]
        assert (windows.recent_count, windows.older_count) == (len(want_recent), len(want_older))
        assert windows.recent_sum == pytest.approx(math.fsum(want_recent), rel=1e-9, abs=1e-6)
        assert windows.older_sum == pytest.approx(math.fsum(want_older), rel=1e-9, abs=1e-6)
