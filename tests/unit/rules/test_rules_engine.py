"""The engine: aliases, one alert per series, inhibition, ending runs, live ticks = replay."""

from __future__ import annotations

import io
import json
import math

import pytest
from support.series import WALL0, evaluate, merge, points, ruleset, timeline

from trainsentry.backtest.replay import replay
from trainsentry.point import Point, Row, points_of
from trainsentry.rules.aliases import Aliases
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import load_rules

ALERT_KEYS = {"run", "rule", "severity", "state", "step", "wall_time", "metric", "value", "message"}


def test_common_writers_tags_resolve_to_canonical_names() -> None:
    aliases = Aliases()
    expected = {
        "train/loss": "loss",  # HF Trainer
        "train_loss": "loss",  # Lightning
        "train/epoch_loss": "loss",  # Keras
        "Loss/train": "loss",  # tutorial
        "eval/loss": "val_loss",
        "validation/epoch_loss": "val_loss",
        "Loss/val": "val_loss",
        "train/grad_norm": "grad_norm",
        "Gradient/Norm": "grad_norm",
        "train/learning_rate": "lr",
        "lr-Adam/pg1": "lr",  # Lightning LearningRateMonitor
        "probe/grad_norm/fc1.weight": "grad_norm/fc1.weight",
        "something/else": "something/else",
    }
    assert {tag: aliases.resolve(tag) for tag in expected} == expected


def test_user_aliases_extend_and_override_the_shipped_table() -> None:
    rules = ruleset(
        "- {name: nf, metric: loss, non_finite: {}}",
        "loss: [my/objective, 'custom/*']",
    )
    got = evaluate(rules, points("nan", tag="my/objective"), points("nan", tag="custom/x"))
    assert {t.metric for t in got} == {"my/objective", "custom/x"}
    assert {t.canonical for t in got} == {"loss"}


def test_a_pattern_rule_yields_one_alert_per_matching_series() -> None:
    rules = "- {name: dead, metric: 'grad_norm/*', threshold: {below: 1.0e-6}}"
    got = evaluate(
        rules,
        points("1 1e-9 1e-9", tag="probe/grad_norm/fc1"),
        points("1 1 1e-9", tag="probe/grad_norm/fc2"),
        points("1e-9", tag="probe/grad_norm_total"),  # not a layer: `grad_norm_total`
    )
    assert [(t.metric, t.canonical, t.step) for t in got] == [
        ("probe/grad_norm/fc1", "grad_norm/fc1", 1),
        ("probe/grad_norm/fc2", "grad_norm/fc2", 2),
    ]


def test_a_tag_selector_matches_raw_tags() -> None:
    rules = "- {name: nf, tag: 'train/*', non_finite: {}}"
    got = evaluate(rules, points("nan", tag="train/acc"), points("nan", tag="eval/acc"))
    assert [t.metric for t in got] == ["train/acc"]


def test_runs_are_evaluated_independently() -> None:
    rules = "- {name: hot, metric: loss, threshold: {above: 5}}"
    got = evaluate(rules, points("1 9", run="a"), points("9 1", run="b"))
    assert sorted((t.run, t.state, t.step) for t in got) == [
        ("a", "firing", 1),
        ("b", "firing", 0),
        ("b", "resolved", 1),
    ]


def test_a_critical_inhibits_the_warning_of_its_family_and_run() -> None:
    rules = """
    - {name: warm, metric: loss, family: loss, threshold: {above: 5}}
    - {name: hot, metric: loss, family: loss, severity: critical, threshold: {above: 10}}
    - {name: other, metric: loss, threshold: {above: 5}}
    """
    got = evaluate(rules, points("1 6 11 12 6 1"))
    assert [(t.rule, t.state, t.step, t.reason) for t in got] == [
        ("warm", "firing", 1, None),
        ("other", "firing", 1, None),
        ("hot", "firing", 2, None),
        ("warm", "resolved", 2, "inhibited by hot"),
        ("hot", "resolved", 4, "recovered"),
        ("warm", "firing", 4, None),  # still above 5 when the critical clears
        ("warm", "resolved", 5, "recovered"),
        ("other", "resolved", 5, "recovered"),
    ]


def test_an_inhibited_warning_that_clears_meanwhile_says_nothing_more() -> None:
    rules = """
    - {name: warm, metric: loss, family: f, threshold: {above: 5}}
    - {name: hot, metric: val_loss, family: f, severity: critical, threshold: {above: 10}}
    """
    got = evaluate(rules, merge(points("6 6 1 1", tag="loss"), points("1 11 11 1", tag="val_loss")))
    assert [(t.rule, t.state, t.step) for t in got] == [
        ("warm", "firing", 0),
        ("hot", "firing", 1),
        ("warm", "resolved", 1),
        ("hot", "resolved", 3),
    ]


def test_a_warning_firing_only_by_its_latch_stays_quiet_when_the_critical_clears() -> None:
    """keep_firing_for holds the lifecycle, not the condition: re-firing then would page
    on healthy data with evidence that says the opposite. Holding again re-fires it."""
    rules = """
    - {name: warm, metric: loss, family: f, threshold: {above: 5}, keep_firing_for: 100 steps}
    - {name: hot, metric: val_loss, family: f, severity: critical, threshold: {above: 10}}
    """
    got = evaluate(
        rules, merge(points("6 6 1 1 6 1", tag="loss"), points("1 11 1 1 1 1", tag="val_loss"))
    )
    assert [(t.rule, t.state, t.step, t.reason) for t in got] == [
        ("warm", "firing", 0, None),
        ("hot", "firing", 1, None),
        ("warm", "resolved", 1, "inhibited by hot"),
        ("hot", "resolved", 2, "recovered"),  # warm's loss is 1 here: it stays quiet
        ("warm", "firing", 4, None),  # above 5 again while its latch still runs
    ]
    assert "is 6" in got[-1].message


def test_finish_resolves_what_is_firing_with_reason_run_finished() -> None:
    rules = "- {name: hot, metric: loss, threshold: {above: 5}}"
    got = evaluate(rules, points("1 9 9"), finish=True)
    assert [(t.state, t.step, t.reason) for t in got] == [
        ("firing", 1, None),
        ("resolved", 2, "run finished"),
    ]
    assert got[1].message == "resolved (run finished): loss = 9 at step 2"


def test_a_run_that_resumes_from_a_checkpoint_restarts_its_windows() -> None:
    rules = "- {name: flat, metric: loss, plateau: {window: 5 steps, min_improvement: 0.01}}"
    first = points("10-1x9")  # steps 0..9, improving
    resumed = points("3-0.2x9", start=5)  # back to step 5, improving again
    assert evaluate(rules, first + resumed) == []


def test_min_step_keeps_early_points_out_of_a_rule() -> None:
    rules = "- {name: cold, metric: lr, min_step: 3, threshold: {below: 1.0e-9}}"
    assert timeline(evaluate(rules, points("0 0 0 1 0", tag="lr"))) == [("firing", "warning", 4)]


def test_transition_json_carries_the_design_keys_and_the_evidence() -> None:
    rules = """
    - name: hot
      metric: loss
      severity: critical
      threshold: {above: 5}
      labels: {team: nlp}
      runbook: lower the LR
    """
    (t,) = evaluate(rules, points("1 9", tag="train/loss", run="exp1/seed0"))
    line = json.loads(json.dumps(t.as_dict()))
    assert line.keys() >= ALERT_KEYS
    assert line["run"] == "exp1/seed0" and line["metric"] == "train/loss"
    assert line["labels"] == {"team": "nlp"} and line["runbook"] == "lower the LR"
    assert line["message"] == "loss at step 1 is 9, above the threshold 5"


def test_non_finite_values_are_valid_json() -> None:
    (t,) = evaluate("- {name: nf, metric: loss, non_finite: {}}", points("inf"))
    assert json.loads(json.dumps(t.as_dict(), allow_nan=False))["value"] == "inf"


def test_message_templates_fill_in_fields_and_survive_a_bad_format() -> None:
    rules = """
    - name: a
      metric: loss
      threshold: {above: 5}
      message: "{run}: {canonical}={value:.1f} ({evidence})"
    - {name: b, metric: loss, threshold: {above: 5}, message: "{value:d}"}
    """
    a, b = evaluate(rules, points("1 9.25"))
    assert a.message == "r: loss=9.2 (is 9.25, above the threshold 5)"
    assert "message template of b failed" in b.message and "loss at step 1 is 9.25" in b.message


def test_live_ticks_fire_no_data_exactly_as_a_replay_of_the_same_points() -> None:
    rules = ruleset("- {name: stalled, no_data: {factor: 10, min_silence: 60s}}")
    before = points("1x20", seconds_per_step=10.0)
    after = points("1", start=40, seconds_per_step=10.0)
    replayed = Engine(rules).feed_all(before + after)

    live = Engine(rules)
    got = live.feed_all(before)
    now = before[-1].wall_time
    while now < after[0].wall_time:  # the runtime's timer, every 7 s
        now += 7.0
        if now < after[0].wall_time:
            got += live.tick(now)
    got += live.feed_all(after)
    assert [t.as_dict() for t in got] == [t.as_dict() for t in replayed]
    assert [t.state for t in got] == ["firing", "resolved"]


@pytest.mark.parametrize(
    ("rules", "every"),
    [
        ("- {name: stalled, no_data: {min_silence: 60s}}", 0.6),
        ("- {name: stalled, no_data: {min_silence: 60s, max_silence: 30s}}", 0.3),
        ("- {name: hot, metric: loss, threshold: {above: 5}}", 5.0),
    ],
)
def test_the_tick_cadence_is_a_hundredth_of_the_shortest_silence(rules: str, every: float) -> None:
    assert Engine(ruleset(rules)).tick_every == pytest.approx(every)


def test_the_default_pack_is_ticked_every_three_seconds() -> None:
    """Its shortest silence is probe_steps_stopped's 5 minutes: 3 s late is 1 %."""
    assert Engine(load_rules([])).tick_every == pytest.approx(3.0)


def test_silence_resolves_the_runs_other_alerts_with_data_stopped() -> None:
    rules = ruleset(
        """
        - {name: stalled, no_data: {min_silence: 60s}}
        - {name: hot, metric: loss, threshold: {above: 5}}
        """
    )
    engine = Engine(rules)
    got = engine.feed_all(points("1 9"))
    got += engine.tick(WALL0 + 1000)
    assert [(t.rule, t.state, t.reason) for t in got] == [
        ("hot", "firing", None),
        ("stalled", "firing", None),
        ("hot", "resolved", "data stopped"),
    ]


def test_each_tag_of_a_record_moves_the_no_data_clocks_that_watch_it() -> None:
    """One record, one stamp: the run-wide clock moves once, the val_loss one still moves."""
    rules = ruleset(
        """
        - {name: stalled, no_data: {min_silence: 60s}}
        - {name: eval_stalled, metric: val_loss, no_data: {min_silence: 60s}}
        """
    )
    engine = Engine(rules)
    record = [
        Point("r", tag, step, WALL0 + 10.0 * step, 1.0)
        for step in range(6)
        for tag in ("loss", "val_loss")
    ]
    assert engine.feed_all(record) == []
    fired = engine.tick(WALL0 + 1000)
    assert sorted((t.rule, t.state) for t in fired) == [
        ("eval_stalled", "firing"),
        ("stalled", "firing"),
    ]
    resumed = engine.feed_all([Point("r", t, 200, WALL0 + 2000, 1.0) for t in ("loss", "val_loss")])
    assert sorted((t.rule, t.state) for t in resumed) == [
        ("eval_stalled", "resolved"),
        ("stalled", "resolved"),
    ]


def test_tick_without_silence_changes_nothing_and_finished_runs_are_forgotten() -> None:
    rules = ruleset("- {name: stalled, no_data: {min_silence: 60s}}")
    engine = Engine(rules)
    engine.feed_all(points("1 1"))
    assert engine.tick(WALL0 + 30) == []
    assert engine.finish("r") == [] and engine.finish("r") == []
    assert engine.tick(WALL0 + 10_000) == []


def test_firing_lists_what_is_shown_now() -> None:
    engine = Engine(ruleset("- {name: hot, metric: loss, threshold: {above: 5}}"))
    engine.feed_all(points("9", run="a") + points("1", run="b"))
    assert [(t.run, t.rule, t.state) for t in engine.firing()] == [("a", "hot", "firing")]


def test_firing_reads_each_alert_as_it_stands_now() -> None:
    # firing() keeps what it rendered for an alert that has not moved (an idle run's
    # alert is asked for every second): a new point, or a record of other tags that
    # moves the run's stamp, must show.
    engine = Engine(ruleset("- {name: hot, metric: loss, threshold: {above: 5}}"))
    engine.feed_all(points("9", run="a") + points("1", run="b"))
    (first,) = engine.firing()
    assert engine.firing() == [first]
    engine.feed_rows("a", [Row(1, WALL0 + 50, ("loss",), (12.0,))])
    (moved,) = engine.firing()
    assert (moved.step, moved.value, moved.wall_time) == (1, 12.0, WALL0 + 50)
    assert "at step 1" in moved.message and "12" in moved.message
    engine.feed_rows("a", [Row(2, WALL0 + 60, ("lr",), (0.1,))])
    (stamped,) = engine.firing()
    assert (stamped.step, stamped.wall_time) == (1, WALL0 + 60)


def test_replay_prints_json_lines_and_a_text_timeline() -> None:
    rules = ruleset("- {name: hot, metric: loss, threshold: {above: 5}, runbook: cool it}")
    pts = points("1 9 1", tag="train/loss")
    out = io.StringIO()
    assert replay(pts, rules, out=out, fmt="jsonl") == 2
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(x["state"], x["step"]) for x in lines] == [("firing", 1), ("resolved", 2)]
    text = io.StringIO()
    replay(pts, rules, out=text, fmt="text")
    body = text.getvalue()
    assert "FIRING" in body and "RESOLVED" in body and "runbook: cool it" in body
    assert body.rstrip().endswith("1 firing transitions in 1 run(s)")


def test_replay_interleaves_files_of_one_run_by_wall_time() -> None:
    # Keras writes train/ and validation/ to separate files, read one after the other
    rules = ruleset(
        "- {name: gap, metric: val_loss, pair: {other: loss, gap_above: 0.5, other_smoothing: 1}}"
    )
    train = points("1 0.2 0.2 0.2", tag="train/epoch_loss")
    val = points("1 1 1 1", tag="validation/epoch_loss")
    out = io.StringIO()
    replay(train + val, rules, out=out, fmt="jsonl")
    first = json.loads(out.getvalue().splitlines()[0])
    assert first["step"] == 1  # in file order it would have seen train's last value first
    assert replay([Point("r", "loss", 0, 0.0, 1.0)], rules, out=io.StringIO(), fmt="jsonl") == 0


def test_reload_keeps_unchanged_rules_state_and_resolves_removed_ones() -> None:
    both = ruleset(
        """
        - {name: hot, metric: loss, threshold: {above: 5}}
        - {name: flat, metric: loss, plateau: {window: 3 points, min_delta: 0.1, method: best}}
        """
    )
    engine = Engine(both)
    assert [t.rule for t in engine.feed_all(points("9 9"))] == ["hot"]
    changed = ruleset(
        """
        - {name: hot, metric: loss, threshold: {above: 5}}
        - {name: nf, metric: loss, non_finite: {}}
        """
    )
    assert engine.reload(changed) == []  # `hot` kept firing, silently
    got = engine.feed_all(points("nan 1", start=2))
    assert [(t.rule, t.state, t.step) for t in got] == [
        ("nf", "firing", 2),
        ("hot", "resolved", 3),
        ("nf", "resolved", 3),
    ]
    gone = engine.reload(ruleset("- {name: nf, metric: loss, non_finite: {}}"))
    assert gone == []
    engine.feed_all(points("nan", start=4))
    (t,) = engine.reload(ruleset("- {name: nf, metric: loss, severity: critical, non_finite: {}}"))
    assert (t.rule, t.state, t.reason) == ("nf", "resolved", "rule changed")


def test_an_engine_saved_and_restored_mid_run_judges_the_rest_as_one_that_never_stopped() -> None:
    """The snapshot packs the conditions' windows (rules/packed.py): nothing of them is lost."""
    import math
    import random

    from trainsentry.alerts.grouping import FiringBook
    from trainsentry.runtime.restart import dump_state, load_state

    rng = random.Random(7)
    pts: list[Point] = []
    wall = 1_700_000_000.0
    for step in range(600):
        wall += 1.0 if step < 350 else 4.0  # steps slow down late: throughput
        loss = 2.0 / (1 + step / 50) + rng.random() * 0.05
        if step == 300:
            loss *= 8  # a spike
        if step > 500:
            loss *= math.exp((step - 500) / 20)  # runaway
        grad = 1.0 + rng.random() if step < 400 else math.exp((step - 400) / 15)
        pts += [
            Point("r", "train/loss", step, wall, loss),
            Point("r", "train/grad_norm", step, wall, grad),
            Point("r", "eval/loss", step, wall, loss * (1 + step / 300)),
        ]
    cut = len(pts) // 2
    whole = Engine(load_rules())
    expected = whole.feed_all(pts)

    first = Engine(load_rules())
    before = first.feed_all(pts[:cut])
    spool = io.BytesIO()
    dump_state(first, FiringBook(), [], spool)
    saved = load_state(spool.getvalue())
    assert saved is not None
    after = saved.engine.feed_all(pts[cut:])
    assert [t.as_dict() for t in before + after] == [t.as_dict() for t in expected]
    fired = {t.rule for t in expected}
    assert fired >= {"loss_spike", "grad_norm_far_above_baseline", "throughput_drop"}


def test_rows_judge_exactly_as_their_points_fed_one_by_one() -> None:
    """The live path feeds records (one plan per row shape); fed a value at a time, the
    same data must give the same transitions in the same order: the per-shape plan
    is a cache, never a change. Two runs, judged and logged-only tags, a divergence,
    NaN (once in the row that ends a silence), a rewind and a row with a tag twice."""
    from trainsentry.rules.loader import load_rules

    rules = load_rules()
    logged = tuple(f"train/metric_{i}" for i in range(17))
    shape = ("train/loss", "train/grad_norm", "train/learning_rate", *logged)
    rows: dict[str, list[Row]] = {"a": [], "b": []}
    for run, grows in (("a", 1.15), ("b", 1.0)):
        for step in range(300):
            wall = WALL0 + step * (1.0 if step != 200 else 4000.0)
            loss = math.nan if run == "a" and step in (200, 250) else 2.0 / (1 + step)
            values = (loss, 0.5 * grows ** max(0, step - 150), 1e-4) + (0.0,) * 17
            rows[run].append(Row(step, wall, shape, values))
        rows[run].insert(120, Row(100, WALL0 + 120.5, shape, rows[run][100].values))
        rows[run].append(Row(300, WALL0 + 9000.0, ("train/loss", "train/loss"), (1.0, 2.0)))
    by_rows, by_points = Engine(rules), Engine(rules)
    got: list = []
    want: list = []
    for i in range(0, 302, 10):  # the runs' files read in turns, ten records at a time
        for run in ("a", "b"):
            got += by_rows.feed_rows(run, rows[run][i : i + 10])
            for p in points_of(run, rows[run][i : i + 10]):
                want += by_points.feed(p)
    got += by_rows.tick(WALL0 + 20000.0)
    want += by_points.tick(WALL0 + 20000.0)
    assert {t.rule for t in want} >= {
        "grad_norm_exponential_growth",
        "loss_non_finite",
        "run_stalled",
    }
    assert [t.as_dict() for t in got] == [t.as_dict() for t in want]


JUMP_PAIR = """
- name: jump
  metric: lr
  severity: critical
  pair: {other: loss, jump_from_max: 10, other_jump: 3, other_smoothing: 10}
  for: 2 points
"""


@pytest.mark.parametrize("lr_first", [True, False])
def test_a_jump_pair_is_judged_with_its_own_records_other_in_either_order(
    lr_first: bool,
) -> None:
    # Lightning's LearningRateMonitor writes the lr before the step's loss; HF the loss
    # first. Either way the pair holds on the 2nd and 3rd jumped records (steps 50, 60):
    # its `for` counts them, the wait for the loss of step 50 cancels nothing.
    lr = points("1e-4x4 1 1 1", tag="lr", every=10)
    loss = points("1x4 40 400 4000", tag="loss", every=10)
    first, second = (lr, loss) if lr_first else (loss, lr)
    rows = sorted([*first, *second], key=lambda p: p.step)  # stable: `first` leads each step
    got = Engine(ruleset(JUMP_PAIR)).feed_all(rows)
    assert [(t.rule, t.state, t.step) for t in got] == [("jump", "firing", 60)]


@pytest.mark.parametrize("lr_first", [True, False])
def test_a_jump_pair_pairs_the_lr_with_the_loss_of_its_own_step(lr_first: bool) -> None:
    # Step 50's jumped lr pairs with step 50's loss (back at 1: no jump), never with the
    # loss of step 40 (×40) that came before it in the file. At 60 the loss is ×5 its
    # level (1 point), at 70 ×312 (2 points): firing at 70, whichever value each record
    # wrote first.
    lr = points("1e-4x4 1 1 1", tag="lr", every=10)
    loss = points("1x3 40 1 40 4000", tag="loss", every=10)
    first, second = (lr, loss) if lr_first else (loss, lr)
    rows = sorted([*first, *second], key=lambda p: p.step)
    got = Engine(ruleset(JUMP_PAIR)).feed_all(rows)
    assert [(t.rule, t.state, t.step) for t in got] == [("jump", "firing", 70)]


def test_a_reload_between_a_records_lr_and_its_loss_drops_the_removed_pairs_wait() -> None:
    engine = Engine(ruleset(JUMP_PAIR.replace("  for: 2 points\n", "")))
    lr = points("1e-4x4 1", tag="lr", every=10)
    loss = points("1x4", tag="loss", every=10)
    assert engine.feed_all(sorted([*lr, *loss], key=lambda p: p.step)) == []  # lr 50 waits
    # another rule still pairs with the loss, so the loss's points look for waiters
    kept = "- {name: gap, metric: val_loss, pair: {other: loss, ratio_above: 100}}"
    assert engine.reload(ruleset(kept)) == []
    assert engine.feed_all(points("40", tag="loss", start=50)) == []  # nothing of `jump`
