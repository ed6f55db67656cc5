"""`trainsentry test`: the shipped pack passes its rule tests; mistakes fail loudly, located."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from support.paths import REPO

from trainsentry import ruletest
from trainsentry.cli import main
from trainsentry.rules.loader import load_rules
from trainsentry.ruletest import load_test_file, run_file

PACK_TESTS = sorted((REPO / "rules" / "tests").glob("*.yaml"))


def write(tmp_path: Path, text: str, name: str = "t_test.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
    )


NAN_CASE = """
    rule_files: [default]
    tests:
      - name: nan loss
        interval: 10
        series:
          train/loss: "2x20 nan 2x3"
        expect_transitions:
          - {step: STEP, rule: loss_non_finite, severity: critical}
          - {step: 220, rule: loss_non_finite, state: resolved}
"""


def test_the_shipped_pack_passes_its_rule_tests() -> None:
    got = run_cli("test", *(str(p.relative_to(REPO)) for p in PACK_TESTS))
    assert got.returncode == 0, got.stdout + got.stderr
    assert " 0 failed" in got.stdout


def test_every_rule_of_the_default_pack_is_tested_firing_near_its_threshold_and_resolving() -> None:
    fired: set[str] = set()
    resolved: set[str] = set()
    quiet: set[str] = set()  # a case about the rule (by name or `only`) in which it never fires
    for path in PACK_TESTS:
        for case in yaml.safe_load(path.read_text("utf-8"))["tests"]:
            expected = case.get("expect_transitions") or []
            firing = {e["rule"] for e in expected if e.get("state", "firing") == "firing"}
            fired |= firing
            resolved |= {e["rule"] for e in expected if e.get("state") == "resolved"}
            about = set(case.get("only") or []) | {case["name"].split(":")[0]}
            if "expect_transitions" in case:
                quiet |= about - firing
    names = {rule.name for rule in load_rules().rules}
    assert names - fired == set(), "rules never tested firing"
    assert names - resolved == set(), "rules never tested resolving"
    assert names - quiet == set(), "rules without a near-threshold case where they stay quiet"


def test_a_wrong_expectation_fails_with_a_readable_diff(tmp_path: Path) -> None:
    path = write(tmp_path, NAN_CASE.replace("STEP", "200"))
    got = run_cli("test", str(path))
    assert got.returncode == 1
    assert f"FAIL  {path}:3  nan loss" in got.stdout
    assert "  - step     200  firing    critical loss_non_finite" in got.stdout
    assert (
        "  + step     210  firing    critical loss_non_finite [train/loss]  loss at step 210 is nan"
        in (got.stdout)
    )
    assert "    step     220  resolved" in got.stdout  # the matching line, unmarked
    assert "0 passed, 1 failed" in got.stdout


def test_a_transition_nobody_expected_fails_the_case(tmp_path: Path) -> None:
    text = NAN_CASE.replace("STEP", "210").replace('"2x20 nan 2x3"', '"2x20 nan 2x3 inf"')
    [result] = run_file(load_test_file(write(tmp_path, text)))
    assert not result.passed
    assert "  + step     260  firing    critical loss_non_finite" in result.failures[0]


def test_only_narrows_a_case_to_the_rules_it_is_about(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        rule_files: [default]
        tests:
          - name: lr at zero, loss NaN ignored
            interval: 10
            only: [lr_stuck_at_zero]
            series:
              train/loss: "2 nan"
              train/learning_rate: "0x3"
            expect_transitions:
              - {step: 20, rule: lr_stuck_at_zero}
        """,
    )
    assert [r.passed for r in run_file(load_test_file(path))] == [True]


def test_expect_at_is_the_exact_set_firing_once_the_step_is_in(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        rule_files: [default]
        tests:
          - name: both
            interval: 10
            series:
              train/loss: "2 nan nan"
              train/learning_rate: "0x3"
            expect_at:
              - {step: 10, firing: [{rule: loss_non_finite}]}
              - {step: 25, firing: [{rule: loss_non_finite}]}
        """,
    )
    [result] = run_file(load_test_file(path))
    assert result.failures == [
        "firing at step 25 (- missing, + extra):\n"
        "    critical loss_non_finite [train/loss]  loss at step 20 is nan\n"
        "  + warning  lr_stuck_at_zero [train/learning_rate]  "
        "lr at step 20 is 0, under the floor 1e-12"
    ]


def test_rule_files_are_read_relative_to_the_test_file(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "mine.yaml").write_text(
        "rules:\n  - {name: high, metric: loss, threshold: {above: 5}}\n", encoding="utf-8"
    )
    path = write(
        tmp_path,
        """
        rule_files: [rules/mine.yaml]
        tests:
          - name: above five
            series: {loss: "1 6 1"}
            expect_transitions:
              - {step: 1, rule: high, severity: warning, message: "above the threshold 5"}
              - {step: 2, rule: high, state: resolved}
        """,
        name="sub_test.yaml",
    )
    assert main(["test", str(path)]) == 0


def test_a_pace_series_gives_the_wall_time_of_each_step(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
        rule_files: [default]
        tests:
          - name: pace
            interval: 10
            seconds_per_step: "0.5 2"
            series: {train/loss: "1x3"}
            expect_transitions: []
        """,
    )
    [case] = load_test_file(path).cases
    walls = [p.wall_time - case.points[0].wall_time for p in case.points]
    assert walls == [0.0, 5.0, 25.0, 45.0]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "rule_files: [default]\ntests:\n  - name: a\n    intervall: 10\n"
            '    series: {loss: "1"}\n    expect_transitions: []\n',
            ":4:5: unknown key `intervall`; did you mean `interval`?",
        ),
        (
            'rule_files: [default]\ntests:\n  - name: a\n    series: {loss: "1 2 3x"}\n'
            "    expect_transitions: []\n",
            ":4:25: cannot read `3x`",
        ),
        (
            "rule_files: [default]\ntests:\n  - name: a\n    series: {loss: 1}\n"
            "    expect_transitions: [{step: 1, rule: loss_non_finit}]\n",
            ":5:42: unknown rule `loss_non_finit`; did you mean `loss_non_finite`?",
        ),
        (
            "rule_files: [default, nope.yaml]\ntests:\n  - name: a\n    series: {loss: 1}\n"
            "    expect_transitions: []\n",
            ":1:23: no such rule file:",
        ),
        (
            "rule_files: [default]\ntests:\n  - name: a\n    series: {loss: 1}\n",
            ":3:5: a test needs `expect_transitions` (use [] for none) or `expect_at`",
        ),
    ],
)
def test_mistakes_in_a_test_file_are_reported_at_file_line_col(
    tmp_path: Path, text: str, error: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ruletest.TestFileError) as caught:
        load_test_file(path)
    assert [e for e in caught.value.errors if e.startswith(f"{path}{error}")], caught.value.errors


def test_a_misspelt_key_does_not_hide_the_other_mistakes_of_the_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "rule_files: [default]\ntests:\n"
        "  - name: a\n    intervl: 10\n    series: {loss: '1 (2'}\n"
        "    expect_transitions: [{step: 1, rule: nosuch}]\n"
        "  - name: b\n    series: {loss: '1 2x'}\n    expect_transitions: []\n",
    )
    with pytest.raises(ruletest.TestFileError) as caught:
        load_test_file(path)
    where = [e[len(str(path)) :].split(": ", 1)[0] for e in caught.value.errors]
    assert where == [":4:5", ":5:23", ":6:42", ":8:23"], caught.value.errors


def test_a_broken_test_file_fails_the_run_but_not_the_other_files(tmp_path: Path) -> None:
    good = write(tmp_path, NAN_CASE.replace("STEP", "210"), name="good_test.yaml")
    bad = write(tmp_path, "rule_files: [default]\ntests: []\n", name="bad_test.yaml")
    got = run_cli("test", str(good), str(bad))
    assert got.returncode == 1
    assert (
        f"ERROR {bad}" in got.stdout and "1 passed, 0 failed, 1 file(s) with errors" in got.stdout
    )


def test_junit_report_lists_every_case_with_its_failure(tmp_path: Path) -> None:
    ok = write(tmp_path, NAN_CASE.replace("STEP", "210"), name="ok_test.yaml")
    wrong = write(tmp_path, NAN_CASE.replace("STEP", "200"), name="wrong_test.yaml")
    report = tmp_path / "out" / "junit.xml"
    assert main(["test", str(ok), str(wrong), "--junit", str(report)]) == 1
    root = ET.parse(report).getroot()
    assert (root.get("tests"), root.get("failures")) == ("2", "1")
    failures = root.findall(".//testcase/failure")
    assert len(failures) == 1 and "- step     200" in (failures[0].text or "")
