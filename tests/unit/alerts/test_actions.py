"""Rule actions: the stop file (run dir or control dir) and commands (no shell, timeout)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from support.notify_harness import Harness, transition

from trainsentry.actions.command import run_command
from trainsentry.rules import model as m
from trainsentry.rules.loader import load_rules

RULE_FILE = """\
version: 1
rules:
  - name: loss_nan
    metric: loss
    severity: critical
    non_finite:
    actions: [stop, {command: [notify-oncall, --page], timeout: 5}]
  - name: loss_high
    metric: loss
    threshold: {above: 10}
"""


def test_a_rule_opts_into_actions_in_yaml(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(RULE_FILE)
    rules = {r.name: r for r in load_rules([str(tmp_path / "r.yaml")]).rules}
    assert rules["loss_nan"].actions == (
        m.Action("stop"),
        m.Action("command", ("notify-oncall", "--page"), 5.0),
    )
    assert rules["loss_high"].actions == ()


def with_rule(h: Harness, rule: m.Rule, run_dir: Path | None) -> None:
    h.notifier._rule_of = lambda name: rule if name == rule.name else None
    h.notifier._run_dir = lambda run: run_dir


STOP_RULE = m.Rule("loss_spike", m.NonFinite(), "critical", actions=(m.Action("stop"),))


def test_the_stop_file_is_written_in_the_run_directory_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "logs" / "exp1"
    run_dir.mkdir(parents=True)
    h = Harness(tmp_path / "state")
    with_rule(h, STOP_RULE, run_dir)
    h.notifier.submit([transition(severity="critical", step=340)])
    stop = run_dir / ".trainsentry" / "STOP"
    content = json.loads(stop.read_text())
    assert (content["rule"], content["step"]) == ("loss_spike", 340)
    assert "threshold 5" in content["reason"]
    stop.unlink()
    h.notifier.submit([transition(severity="critical", step=341, escalated_from="warning")])
    assert not stop.exists()  # once per firing episode
    h.deliver()
    assert "wrote stop file" in h.sink().messages[0].body


def test_with_a_control_dir_the_stop_file_goes_there(tmp_path: Path) -> None:
    h = Harness(tmp_path / "state")
    with_rule(h, STOP_RULE, tmp_path / "read-only-logs" / "exp1")
    h.notifier.control_dir = tmp_path / "control"
    h.notifier.submit([transition(severity="critical", run="exp1/seed0")])
    assert (tmp_path / "control" / "exp1" / "seed0" / ".trainsentry" / "STOP").exists()
    assert not (tmp_path / "read-only-logs").exists()


def test_a_stop_file_that_cannot_be_written_is_reported_in_the_message(tmp_path: Path) -> None:
    run_dir = tmp_path / "logs" / "exp1"
    run_dir.mkdir(parents=True)
    (run_dir / ".trainsentry").write_text("a file where the directory should be")
    h = Harness(tmp_path / "state")
    with_rule(h, STOP_RULE, run_dir)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    assert "stop file NOT written" in h.sink().messages[0].body
    assert "--control-dir" in h.sink().messages[0].body


def test_a_stop_for_a_run_whose_directory_is_unknown_is_reported_not_fatal(tmp_path: Path) -> None:
    h = Harness(tmp_path / "state")
    with_rule(h, STOP_RULE, None)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    assert "stop file NOT written" in h.sink().messages[0].body


def test_a_command_runs_with_the_alert_in_its_environment(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    script = (
        "import json, os, sys; json.dump({k: v for k, v in os.environ.items()"
        " if k.startswith('TRAINSENTRY_')}, open(sys.argv[1], 'w'))"
    )
    rule = m.Rule(
        "loss_spike", m.NonFinite(), "critical",
        actions=(m.Action("command", (sys.executable, "-c", script, str(out))),),
    )  # fmt: skip
    h = Harness(tmp_path / "state")
    with_rule(h, rule, tmp_path)
    h.notifier.submit([transition(severity="critical", message="loss is $(rm -rf /); `x`")])
    h.deliver()
    env = json.loads(out.read_text())
    assert env["TRAINSENTRY_RULE"] == "loss_spike"
    assert env["TRAINSENTRY_RUN"] == "exp1/seed0"
    assert env["TRAINSENTRY_STEP"] == "100"
    assert env["TRAINSENTRY_MESSAGE"] == "loss is $(rm -rf /); `x`"
    assert env["TRAINSENTRY_RUN_DIR"] == str(tmp_path)
    assert json.loads(env["TRAINSENTRY_ALERT"])["severity"] == "critical"
    assert h.outbox.counts() == {"queued": 0, "sent": 2, "failed": 0}


def test_a_failing_command_is_reported_and_not_retried(tmp_path: Path) -> None:
    rule = m.Rule(
        "loss_spike", m.NonFinite(), "critical",
        actions=(m.Action("command", (sys.executable, "-c", "import sys; sys.exit('boom')")),),
    )  # fmt: skip
    h = Harness(tmp_path / "state")
    with_rule(h, rule, None)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    assert h.outbox.counts() == {"queued": 0, "sent": 1, "failed": 1}


def test_command_timeouts_and_missing_programs_are_failures() -> None:
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    slow = run_command(sleep, transition(), timeout=0.2)
    assert (slow.ok, slow.retryable) == (False, False)
    assert "timed out" in slow.error
    missing = run_command(["/no/such/program"], transition(), timeout=5)
    assert not missing.ok
    ok = run_command([sys.executable, "-c", "pass"], transition(), timeout=5)
    assert ok.ok
