"""Rule files: every error at once, at file:line:col, with did-you-mean; the YAML traps."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import pytest

from trainsentry.rules.check import check_paths
from trainsentry.rules.loader import RuleFileError, load_rules, parse_text
from trainsentry.rules.model import Growth, NoData, NonFinite, Span, Threshold


def errors_of(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return [e.replace(str(path), "rules.yaml") for e in check_paths([str(path)])]


def test_a_valid_file_loads_into_frozen_dataclasses() -> None:
    parsed = parse_text(
        """
rules:
  - name: boom
    metric: grad_norm
    severity: critical
    for: 20 steps
    keep_firing_for: 5m
    labels: {team: nlp}
    growth: {window: 40 points, threshold: 1e3, critical_within: 50}
"""
    )
    (rule,) = parsed.rules
    assert rule.metrics == ("grad_norm",) and rule.severity == "critical"
    assert rule.for_ == Span(20, "steps") and rule.keep_firing_for == Span(300, "seconds")
    assert rule.labels == (("team", "nlp"),)
    assert rule.condition == Growth(
        window=Span(40, "points"), threshold=1000.0, critical_within=50.0
    )


def test_unknown_keys_are_rejected_with_did_you_mean(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        """rules:
  - name: a
    metric: loss
    keep_firng_for: 10 steps
    plateau: {window: 10 points, min_improvment: 0.1}
""",
    )
    assert errs == [
        "rules.yaml:4:5: unknown key `keep_firng_for`; did you mean `keep_firing_for`?",
        "rules.yaml:5:34: unknown key `min_improvment`; did you mean `min_improvement`?",
    ]


def test_a_misspelt_condition_kind_is_suggested(tmp_path: Path) -> None:
    errs = errors_of(tmp_path, "rules:\n  - name: a\n    metric: loss\n    grwoth: {window: 5}\n")
    assert "rules.yaml:4:5: unknown key `grwoth`; did you mean `growth`?" in errs


def test_every_error_in_the_file_is_reported_at_once_in_line_order(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        """rules:
  - name: a
    metric: loss
    severity: fatal
    growth:
      window: 40 stepz
      threshold: abc
  - name: b
    metric: x
  - name: c
    metric: loss
    message: "{valu} at {step}"
    non_finite:
""",
    )
    assert errs == [
        "rules.yaml:4:15: expected 'warning' or 'critical', got 'fatal'",
        "rules.yaml:6:15: expected a span like `200 steps`, `10 points` (evaluations), "
        "`90s`, `5m` or `2h`, got '40 stepz'",
        "rules.yaml:7:18: expected a number, got 'abc'",
        "rules.yaml:8:5: a rule needs exactly one condition (non_finite, threshold, plateau, "
        "rise, pair, baseline, throughput, no_data, stale, growth, spike, across_ranks, "
        "across_layers, pattern, collective_hang, restarts, checkpoints); found none",
        "rules.yaml:12:14: unknown placeholder {valu} in message; known: canonical, evidence, "
        "labels, line, match, metric, path, rule, run, runbook, severity, step, value, wall_time",
    ]


def test_missing_required_keys_point_at_their_mapping(tmp_path: Path) -> None:
    errs = errors_of(tmp_path, "rules:\n  - metric: loss\n    plateau: {min_delta: 1}\n")
    assert "rules.yaml:2:5: missing required key `name`" in errs
    assert "rules.yaml:3:14: missing required key `window`" in errs


def test_yaml_syntax_errors_carry_their_position(tmp_path: Path) -> None:
    (err,) = errors_of(tmp_path, "rules:\n  - name: a\n    metric: [loss\n")
    assert err.startswith("rules.yaml:4:1: YAML syntax:")


def test_a_duplicate_rule_is_reported_with_the_other_errors_not_after_them(
    tmp_path: Path,
) -> None:
    errs = errors_of(
        tmp_path,
        """rules:
  - {name: a, metric: loss, non_finite: {}, threshold: {above: 1}}
  - {name: a, metric: loss, non_finite: {}}
  - {name: b, metrc: loss, non_finite: {}}
""",
    )
    assert [e.split(": ", 1)[0] for e in errs] == [
        "rules.yaml:2:5",
        "rules.yaml:3:12",
        "rules.yaml:4:15",
    ]
    assert "defined twice" in errs[1] and "did you mean `metric`" in errs[2]


def test_duplicate_keys_and_duplicate_rules_are_errors(tmp_path: Path) -> None:
    errs = errors_of(
        tmp_path,
        """rules:
  - {name: a, metric: loss, metric: val_loss, non_finite: {}}
  - {name: a, metric: loss, non_finite: {}}
""",
    )
    assert errs == [
        "rules.yaml:2:29: duplicate key `metric` (YAML keeps only the last)",
        "rules.yaml:3:12: rule `a` is defined twice in this file",
    ]


def test_yaml_1_1_traps_are_read_as_a_user_means_them() -> None:
    parsed = parse_text(
        """
rules:
  - name: on
    metric: on
    enabled: yes
    threshold: {above: 1e3, below: 1.5e-7}
"""
    )
    (rule,) = parsed.rules
    # PyYAML (YAML 1.1) would make the name True and the threshold the string "1e3"
    assert rule.name == "on" and rule.metrics == ("on",)
    assert rule.condition == Threshold(above=1000.0, below=1.5e-7)


def test_numeric_strings_are_accepted_for_numbers() -> None:
    (rule,) = parse_text('rules: [{name: a, metric: loss, threshold: {above: "1e3"}}]').rules
    assert rule.condition == Threshold(above=1000.0)


def test_spans_accept_steps_points_and_times() -> None:
    assert Span.parse(200) == Span(200, "steps")
    assert Span.parse("10 evals") == Span(10, "points")
    assert Span.parse("1.5h") == Span(5400, "seconds")
    assert Span.parse("2e3 steps") == Span(2000, "steps")
    with pytest.raises(ValueError, match="expected a span"):
        Span.parse("soon")


def test_for_and_keep_firing_for_accept_and_points() -> None:
    (rule,) = parse_text(
        "rules: [{name: a, metric: grad_norm, threshold: {below: 1e-5},"
        " for: 100 steps and 2 points, keep_firing_for: 5m and 3 points}]"
    ).rules
    assert rule.for_ == Span(100, "steps", min_points=2)
    assert rule.keep_firing_for == Span(300, "seconds", min_points=3)
    assert str(rule.for_) == "100 steps and 2 points"
    with pytest.raises(ValueError, match="both are points"):
        Span.parse_hold("10 points and 2 points")
    with pytest.raises(ValueError, match="optionally with `and N points`"):
        Span.parse_hold("100 steps and two points")


def test_and_points_is_refused_where_it_means_nothing(tmp_path: Path) -> None:
    window = errors_of(
        tmp_path,
        "rules:\n  - name: a\n    metric: loss\n    plateau: {window: 100 steps and 2 points}\n",
    )
    assert len(window) == 1 and "expected a span" in window[0], window
    pattern = errors_of(
        tmp_path,
        "rules:\n  - name: a\n    pattern: {regex: boom}\n    keep_firing_for: 10m and 2 points\n",
    )
    assert len(pattern) == 1 and "drop `and N points`" in pattern[0], pattern


def test_merge_keys_let_rules_share_a_template() -> None:
    parsed = parse_text(
        """
rules:
  - &grad {name: a, metric: grad_norm, severity: critical, non_finite: {}}
  - <<: *grad
    name: b
"""
    )
    assert [(r.name, r.severity, r.metrics) for r in parsed.rules] == [
        ("a", "critical", ("grad_norm",)),
        ("b", "critical", ("grad_norm",)),
    ]


def test_no_data_silence_must_be_a_time(tmp_path: Path) -> None:
    errs = errors_of(tmp_path, "rules:\n  - {name: a, no_data: {min_silence: 10 steps}}\n")
    assert errs == ["rules.yaml:2:38: silence is a time, e.g. `15m` or `900s`"]
    (rule,) = parse_text("rules:\n  - {name: a, no_data: {min_silence: 10m}}\n").rules
    assert rule.condition == NoData(min_silence=600.0) and rule.metrics == ("*",)


def test_check_reports_unreadable_paths_and_empty_directories(tmp_path: Path) -> None:
    assert check_paths([str(tmp_path / "nope.yaml")]) == [
        f"{tmp_path / 'nope.yaml'}:1:1: cannot read: No such file or directory"
    ]
    assert check_paths([str(tmp_path)]) == [
        f"{tmp_path}:1:1: no rule files (*.yaml, *.yml) here (a log directory? "
        "they go before --rules)"
    ]


def test_check_lints_every_file_of_a_directory(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules: [{name: a, metric: x, non_finite: {}}]\n")
    (tmp_path / "b.yml").write_text("rules: [{name: b, metric: x}]\n")
    (err,) = check_paths([str(tmp_path)])
    assert err.startswith(f"{tmp_path / 'b.yml'}:1:9: a rule needs exactly one condition")


def test_load_rules_without_paths_is_the_default_pack() -> None:
    names = {r.name for r in load_rules().rules}
    assert {"loss_non_finite", "grad_norm_exponential_growth", "run_stalled"} <= names


def test_a_later_file_retunes_or_drops_a_shipped_rule(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text(
        """rules:
  - {name: loss_plateau, metric: loss, plateau: {window: 500 steps, min_improvement: 0.05}}
  - {name: run_stalled, enabled: false, no_data: {}}
aliases:
  loss: [my/loss]
"""
    )
    rules = load_rules(["default", str(mine)])
    by_name = {r.name: r for r in rules.rules}
    assert "run_stalled" not in by_name
    assert by_name["loss_plateau"].condition.window == Span(500, "steps")  # type: ignore[union-attr]
    assert ("loss", ("my/loss",)) in rules.aliases


def test_load_rules_raises_with_the_errors_of_every_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules: [{name: a}]\n")
    (tmp_path / "b.yaml").write_text("rulez: []\n")
    with pytest.raises(RuleFileError) as caught:
        load_rules([str(tmp_path / "a.yaml"), str(tmp_path / "b.yaml")])
    assert len(caught.value.errors) == 2
    assert "did you mean `rules`?" in caught.value.errors[1]


def test_a_rules_directory_loads_the_pack_not_its_tests(tmp_path) -> None:
    from trainsentry.rules.loader import expand_paths

    (tmp_path / "tests").mkdir()
    for name in ("pack.yaml", "tests/pack_test.yaml", "other_test.yaml"):
        (tmp_path / name).write_text("rules: []\n")
    assert expand_paths([str(tmp_path)]) == [str(tmp_path / "pack.yaml")]


def test_a_rule_of_the_pack_is_dropped_by_its_name_alone(tmp_path: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - name: loss_plateau\n    enabled: false\n")
    names = {r.name for r in load_rules(["default", str(mine)]).rules}
    assert "loss_plateau" not in names and "loss_non_finite" in names


def test_a_rule_shipped_off_is_switched_on_by_its_name_alone(tmp_path: Path) -> None:
    assert "val_loss_stagnation" not in {r.name for r in load_rules().rules}
    on = tmp_path / "on.yaml"
    on.write_text("rules:\n  - {name: val_loss_stagnation, enabled: true}\n")
    rules = {r.name: r for r in load_rules(["default", str(on)]).rules}
    assert rules["val_loss_stagnation"].condition.window == Span(10, "points")  # type: ignore[union-attr]
    # the shipped file does the same; a switch with nothing to switch names its line
    shipped = str(files("trainsentry") / "packs" / "early_stopping.yaml")
    assert "val_loss_stagnation" in {r.name for r in load_rules(["default", shipped]).rules}
    typo = tmp_path / "typo.yaml"
    typo.write_text("rules:\n  - {name: val_loss_stagnaton, enabled: true}\n")
    with pytest.raises(RuleFileError) as info:
        load_rules(["default", str(typo)])
    assert info.value.errors == [
        f"{typo}:2:12: no rule 'val_loss_stagnaton' in an earlier file to switch on"
    ]


@pytest.mark.parametrize(("text", "where"), [("", "1:1"), ("rules:\n", "1:7"), ("# x\n", "1:1")])
def test_an_empty_or_half_written_rule_file_is_refused(
    tmp_path: Path, text: str, where: str
) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RuleFileError) as info:
        load_rules([str(path)])
    assert info.value.errors == [f"{path}:{where}: no rules in this file; write `rules: []` "
                                 "if none is meant"]  # fmt: skip


def test_no_rules_at_all_is_refused_unless_said(tmp_path: Path) -> None:
    aliases_only = tmp_path / "a.yaml"
    aliases_only.write_text("aliases: {loss: [my/objective]}\n")
    with pytest.raises(RuleFileError, match="hold no rule"):
        load_rules([str(aliases_only)])
    none = tmp_path / "none.yaml"
    none.write_text("rules: []\n")
    assert load_rules([str(none)]).rules == ()
    assert load_rules(["default", str(aliases_only)]).rules  # an add-on to a pack


def test_a_directory_without_rule_files_given_as_rules_is_refused(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(RuleFileError, match=r"no rule files .* they go before --rules"):
        load_rules([str(tmp_path / "logs")])


def test_a_non_finite_pairing_needs_both_its_keys(tmp_path: Path) -> None:
    (err,) = errors_of(
        tmp_path, "rules:\n  - name: a\n    metric: grad_norm\n    non_finite: {other: loss}\n"
    )
    assert err == "rules.yaml:4:17: `other` and `other_at_most` go together", err
    (rule,) = parse_text(
        "rules: [{name: a, metric: grad_norm, non_finite: {other: loss, other_at_most: 0}}]"
    ).rules
    assert rule.condition == NonFinite(other="loss", other_at_most=0.0)


def test_a_rise_resolve_factor_is_an_ewma_rises_and_under_its_factor(tmp_path: Path) -> None:
    (over,) = errors_of(
        tmp_path,
        "rules:\n  - name: a\n    metric: loss\n    rise: {factor: 3, resolve_factor: 4}\n",
    )
    assert "`resolve_factor` is at most `factor`" in over, over
    (window,) = errors_of(
        tmp_path,
        "rules:\n  - name: a\n    metric: loss\n"
        "    rise: {factor: 3, resolve_factor: 2, window: 100 steps}\n",
    )
    assert "not both" in window, window
