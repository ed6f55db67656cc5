"""A user's pattern cannot freeze trainsentry: the real `check` and `replay` on patterns that
backtrack in Python's re, and on what RE2 refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def trainsentry(*args: str) -> subprocess.CompletedProcess[str]:
    # 60 s: `(a+)+$` on forty a's and a `!` takes a backtracking engine days
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", *args], capture_output=True, text=True, timeout=60
    )


def rule_file(tmp_path: Path, regex: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(
        f"rules:\n  - name: nested\n    severity: warning\n    pattern:\n      regex: '{regex}'\n"
    )
    return path


def test_a_nested_repeat_is_accepted_and_judges_a_hostile_line_at_once(tmp_path: Path) -> None:
    rules = rule_file(tmp_path, "(a+)+$")
    checked = trainsentry("check", str(rules))
    assert (checked.returncode, checked.stdout) == (0, f"trainsentry: {rules}: ok\n")
    run = tmp_path / "logs" / "job"
    run.mkdir(parents=True)
    hostile = "a" * 40 + "!\n"
    (run / "stdout.log").write_text(hostile * 200 + "a" * 40 + "\n" + hostile)
    replayed = trainsentry(
        "replay", str(tmp_path / "logs"), "--rules", str(rules), "--format", "jsonl"
    )
    assert replayed.returncode == 0, replayed.stderr
    alerts = [json.loads(x) for x in replayed.stdout.splitlines()]
    fired = [(a["rule"], a["log"]["line"]) for a in alerts if a["state"] == "firing"]
    assert fired == [("nested", 201)]  # the one line of a's that ends the line


def test_a_backreference_is_refused_at_its_line_and_column_with_the_reason(
    tmp_path: Path,
) -> None:
    rules = rule_file(tmp_path, "(\\w+) \\1")
    checked = trainsentry("check", str(rules))
    assert checked.returncode == 1
    assert checked.stdout.splitlines()[0] == (
        f"{rules}:5:14: bad regex: a backreference (\\1) cannot be matched in linear time;"
        " match the text itself (patterns are RE2: docs/rules.md)"
    )
    run = tmp_path / "logs" / "job"
    run.mkdir(parents=True)
    (run / "stdout.log").write_text("hello hello\n")
    replayed = trainsentry("replay", str(tmp_path / "logs"), "--rules", str(rules))
    assert replayed.returncode == 2
    assert replayed.stderr.startswith(f"{rules}:5:14: bad regex: a backreference")
