"""`trainsentry run` as a service: HTTP API, status, config, SIGHUP reload, shards."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from support.daemon_process import DaemonProcess
from support.in_process import into
from support.ports import free_port

from trainsentry.point import Point
from trainsentry.runtime.loop import Daemon
from trainsentry.sources.shard import parse_shard
from trainsentry.state.db import StateDB

RULE = """\
rules:
  - name: {name}
    metric: loss
    severity: warning
    threshold: {{above: 100}}
"""


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_running_daemon_serves_health_metrics_runs_and_status(tmp_path: Path) -> None:
    root = tmp_path / "logs" / "exp1"
    root.mkdir(parents=True)
    (root / "m.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n')
    address = f"127.0.0.1:{free_port()}"
    daemon = DaemonProcess(
        str(tmp_path / "logs"),
        "--state-dir",
        str(tmp_path / "s"),
        "--http",
        address,
        merge_stderr=True,
    )
    try:
        daemon.wait_for_text(f"API on http://{address}")
        assert get(f"http://{address}/healthz")[0] == 200
        runs: list[dict] = []
        stop = threading.Event()
        for _ in range(100):  # the loop publishes a snapshot after its first cycle
            runs = json.loads(get(f"http://{address}/api/runs")[1])["runs"]
            if runs or stop.wait(0.1):
                break
        assert [r["run"] for r in runs] == ["exp1"] and runs[0]["last_step"] == 2
        status, metrics = get(f"http://{address}/metrics")
        assert status == 200 and "trainsentry_points_read_total 2.0" in metrics
        table = subprocess.run(
            [sys.executable, "-m", "trainsentry", "status", "--address", address],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "exp1" in table and "RUN" in table
    finally:
        daemon.stop()


def test_sighup_reloads_rules_and_keeps_the_old_ones_when_the_new_are_broken(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text(RULE.format(name="first"))
    config = tmp_path / "trainsentry.yaml"
    config.write_text(f"rules: [{rules}]\nhttp: {{address: 'off'}}\n")
    (tmp_path / "logs").mkdir()
    daemon = DaemonProcess(
        str(tmp_path / "logs"),
        "--config",
        str(config),
        "--state-dir",
        str(tmp_path),
        merge_stderr=True,
    )
    try:
        daemon.wait_for_text("with 1 rule ")
        rules.write_text("rules:\n  - name: broken\n    metric: loss\n    severity: loud\n")
        daemon.proc.send_signal(signal.SIGHUP)
        assert "mine.yaml:4:15" in daemon.wait_for_text("mine.yaml:")
        daemon.wait_for_text("reload failed; the old rules keep running")
        rules.write_text(RULE.format(name="first") + RULE.format(name="second")[len("rules:\n") :])
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for_text("reloaded 2 rules")
    finally:
        daemon.stop()


def test_a_bad_config_value_is_reported_at_file_line_col(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("poll: often\nhistroy: 10\n")
    out = subprocess.run(
        [sys.executable, "-m", "trainsentry", "run", str(tmp_path), "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    assert f"{config}:1:7:" in out.stderr
    assert f"{config}:2:1:" in out.stderr and "history" in out.stderr


def test_shards_split_the_runs_between_daemons(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    for i in range(12):
        (root / f"run{i}").mkdir(parents=True)
        (root / f"run{i}" / "m.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    seen: list[set[str]] = []
    for spec in ("1/2", "2/2"):
        got: list[Point] = []
        shard = parse_shard(spec)
        daemon = Daemon(
            [root], StateDB(tmp_path / f"{spec[0]}.db"), [into(got)], owns_run=shard.owns
        )
        daemon.start()
        daemon.close()
        seen.append({p.run for p in got})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert seen[0] | seen[1] == {f"run{i}" for i in range(12)}


def test_a_storm_of_signals_never_deadlocks_the_loop(tmp_path: Path) -> None:
    """Signal handlers only set flags: one that took a lock could hang the main thread."""
    (tmp_path / "logs").mkdir()
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--http", "off", "--state-dir", str(tmp_path), merge_stderr=True
    )
    try:
        daemon.wait_for_text("watching")
        for _ in range(300):
            daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for_text("reloaded")
    finally:
        daemon.stop()
    assert daemon.proc.returncode == 0


def test_an_empty_rule_file_on_sighup_keeps_the_old_rules_and_their_alerts(
    tmp_path: Path,
) -> None:
    """A non-atomic rewrite caught by the signal reads as an empty file: monitoring must
    not go dark, nor every firing alert resolve "rule changed"."""
    rules = tmp_path / "mine.yaml"
    rules.write_text(RULE.format(name="loss_high"))
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    (run / "m.jsonl").write_text('{"step": 1, "loss": 500}\n')
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--rules", str(rules), "--state-dir", str(tmp_path / "s"),
        "--http", "off", "--history", "all", merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("FIRING")
        rules.write_text("")
        daemon.proc.send_signal(signal.SIGHUP)
        assert "no rules in this file" in daemon.wait_for_text("mine.yaml:1:1:")
        daemon.wait_for_text("reload failed; the old rules keep running")
        rules.write_text("rules:\n")  # the same, half written
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for_text("mine.yaml:1:7:")
        daemon.wait_until(lambda: "".join(daemon.lines).count("reload failed") == 2)
    finally:
        daemon.stop()
    assert "rule changed" not in "".join(daemon.lines)
    assert "RESOLVED" not in "".join(daemon.lines)


def test_a_sighup_keeps_the_rules_given_on_the_command_line_over_the_configs(
    tmp_path: Path,
) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text(RULE.format(name="first"))
    config = tmp_path / "trainsentry.yaml"
    config.write_text("rules: [default]\nhttp: 'off'\n")  # 25 rules, were the flag lost
    (tmp_path / "logs").mkdir()
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--config", str(config), "--rules", str(rules),
        "--state-dir", str(tmp_path / "s"), merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("with 1 rule ")
        rules.write_text(RULE.format(name="first") + RULE.format(name="second")[len("rules:\n") :])
        daemon.proc.send_signal(signal.SIGHUP)
        daemon.wait_for_text("reloaded 2 rules")
    finally:
        daemon.stop()
    assert "take effect on restart" not in "".join(daemon.lines)  # nothing else changed


def test_a_busy_address_written_in_the_config_stops_the_start(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        config = tmp_path / "c.yaml"
        config.write_text(f"http: 127.0.0.1:{port}\n")  # the shorthand, as explicit as the rest
        out = subprocess.run(
            [sys.executable, "-m", "trainsentry", "run", str(tmp_path), "--config", str(config),
             "--state-dir", str(tmp_path / "s")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2
    assert f"127.0.0.1:{port}" in out.stderr.splitlines()[-1]
