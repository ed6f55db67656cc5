"""The common mistakes end in one line saying what is wrong and what to do, never a traceback.

Each case runs the real command in a subprocess, as a user would meet it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest


def trainsentry(*args: str) -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout == "", done.stdout
    return done.returncode, done.stderr.splitlines()


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    return tmp_path / "logs"


@pytest.mark.parametrize("command", [["run", "--http", "off"], ["replay"], ["dump"]])
def test_a_missing_log_path_says_to_give_an_existing_one(
    tmp_path: Path, command: list[str]
) -> None:
    missing = tmp_path / "nope"
    assert trainsentry(*command, str(missing)) == (
        2,
        [f"trainsentry: no such file or directory: {missing}; give an existing log path"],
    )


@pytest.mark.parametrize(
    ("command", "what"),
    [
        ("check", "rule file or directory, or `default`"),
        ("test", "rule test file or directory"),
    ],
)
def test_a_missing_rule_path_says_what_to_give_not_a_log_path(
    tmp_path: Path, command: str, what: str
) -> None:
    missing = tmp_path / "nope.yaml"
    assert trainsentry(command, str(missing)) == (
        2,
        [f"trainsentry: no such file or directory: {missing}; give an existing {what}"],
    )


def test_check_accepts_the_shipped_pack_by_name_as_rules_does() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "check", "default"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "trainsentry: default: ok\n", "")


def test_a_bad_rule_file_names_the_line_and_nothing_runs(tmp_path: Path, logs: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules:\n  - name: x\n    metric: loss\n    threshhold: {above: 1}\n")
    state = str(tmp_path / "state")
    for args in (("replay", str(logs)), ("run", str(logs), "--http", "off", "--state-dir", state)):
        code, lines = trainsentry(*args, "--rules", str(rules))
        assert code == 2
        assert lines[0].startswith(f"{rules}:4:5: unknown key `threshhold`")
        assert "did you mean `threshold`" in lines[0]
        assert lines[1:] == [
            "trainsentry: 1 error(s) in rule files, at the lines above; nothing was run"
        ]
    assert not Path(state).exists()


def test_a_bad_config_names_the_line_and_nothing_runs(tmp_path: Path, logs: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("http:\n  adress: 127.0.0.1:9465\n")
    code, lines = trainsentry("run", str(logs), "--config", str(config))
    assert (code, lines) == (
        2,
        [
            f"{config}:2:3: unknown key `http.adress`; did you mean `address`?",
            "trainsentry: 1 error(s) in the config, at the lines above; nothing was run",
        ],
    )


def test_a_busy_port_says_another_daemon_may_hold_it(tmp_path: Path, logs: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = trainsentry(
            "run", str(logs), "--http", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "s")
        )
    assert code == 2 and len(lines) == 1
    assert lines[0] == (
        f"trainsentry: cannot serve HTTP on 127.0.0.1:{port}: Address already in use; "
        "is another trainsentry running? Give a free HOST:PORT (--http, http.address) or --http off"
    )


def test_status_without_a_daemon_says_where_it_looked_and_what_to_check() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code, lines = trainsentry("status", "--address", f"127.0.0.1:{port}")
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith("trainsentry: no trainsentry daemon answers at ")
    assert f"http://127.0.0.1:{port}/api/runs (Connection refused)" in lines[0]
    assert lines[0].endswith(
        "is it running, and is its HTTP address (http.address in the config, --http) this one?"
    )


def test_a_state_dir_that_cannot_be_created_says_to_give_a_writable_one(
    tmp_path: Path, logs: Path
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, lines = trainsentry("run", str(logs), "--http", "off", "--state-dir", str(blocker / "s"))
    assert (code, len(lines)) == (2, 1)
    assert lines[0].startswith(f"trainsentry: cannot create the state dir {blocker / 's'}: ")
    assert lines[0].endswith("give a writable one with --state-dir (or state_dir in the config)")


def test_a_bad_flag_is_one_line_pointing_at_help() -> None:
    code, lines = trainsentry("run", "--history", "soon")
    assert (code, lines) == (
        2,
        [
            "trainsentry run: argument --history: expected seconds or a duration like "
            "`30s`, `5m`, `4h`, `2d`, got 'soon' (see trainsentry run --help)"
        ],
    )


def test_a_log_root_given_after_rules_is_named_as_such(tmp_path: Path, logs: Path) -> None:
    rules = tmp_path / "mine.yaml"
    rules.write_text("rules: []\n")
    rc, err = trainsentry("run", "--http", "off", "--rules", str(rules), str(logs))
    assert rc == 2
    assert err[0] == (
        f"{logs}:1:1: no rule files (*.yaml, *.yml) here (a log directory? they go before --rules)"
    )


def test_rules_and_compare_rules_each_take_several_files(tmp_path: Path, logs: Path) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("rules:\n  - name: loss_plateau\n    enabled: false\n")
    report = tmp_path / "r.html"
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", str(logs), "--rules", "default",
         str(mine), "--report", str(report), "--compare-rules", "default", str(mine)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"default, {mine}" in report.read_text()  # both packs named by their files
