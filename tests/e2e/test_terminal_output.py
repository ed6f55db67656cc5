"""What a person sees: rich on a terminal (tables, colour), the plain lines everywhere else.

The renderers are checked on a buffer that says it is a terminal; the real
`replay`, `run` and `status` commands in a real pseudo-terminal, and in a pipe,
where their lines must stay exactly the plain format scripts parse.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess
from support.ports import free_port
from support.pty_process import PtyProcess, TtyBuffer, plain, terminal_env

from trainsentry.alert import Transition
from trainsentry.terminal import render as console
from trainsentry.terminal.plain import format_text
from trainsentry.terminal.printer import AlertPrinter

RED, YELLOW, DIM = "\x1b[1;31m", "\x1b[33m", "\x1b[2m"
NOW = time.time()


@pytest.fixture(autouse=True)
def colour_auto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    terminal_env(monkeypatch)
    yield
    console.set_color("auto")


def transition(state: str, severity: str, **kw: object) -> Transition:
    fields: dict[str, object] = dict(
        run="exp1/seed0", rule="loss_non_finite", severity=severity, state=state, step=60,
        wall_time=NOW, metric="train/loss", value=math.nan, message="loss at step 60 is nan",
        runbook="Stop the run and resume from the last good checkpoint.",
    )  # fmt: skip
    fields.update(kw)
    return Transition(**fields)  # type: ignore[arg-type]


FIRED = transition("firing", "critical")
WARNED = transition("firing", "warning", rule="loss_plateau", message="loss stopped improving")
RESOLVED = transition(
    "resolved", "critical", step=79, reason="run finished", message="resolved: loss at step 79"
)


def write_runs(root: Path) -> Path:
    """Two runs: one whose loss turns NaN at step 60, one healthy."""
    for name, nan_at in (("bad", 60), ("good", None)):
        run = root / "exp" / name
        run.mkdir(parents=True)
        with (run / "metrics.jsonl").open("w") as f:
            for s in range(80):
                loss = math.nan if nan_at is not None and s >= nan_at else 2.0 - 0.01 * s
                f.write(json.dumps({"step": s, "loss": loss}) + "\n")
    return root


def test_alerts_on_a_terminal_are_coloured_by_severity_with_the_message_under_them() -> None:
    out = TtyBuffer()
    AlertPrinter(since=0, out=out)([FIRED, WARNED])
    text = out.getvalue()
    assert f"{RED}FIRING" in text and f"{YELLOW}FIRING" in text
    lines = [x.rstrip() for x in plain(text).splitlines()]
    assert lines[0].split() == [
        *time.strftime("%H:%M:%S", time.localtime(NOW)).split(),
        "FIRING", "critical", "exp1/seed0", "loss_non_finite", "train/loss", "step", "60",
    ]  # fmt: skip
    assert lines[1] == " " * 10 + "loss at step 60 is nan"  # under the head, past the time
    assert lines[2].strip() == "runbook: Stop the run and resume from the last good checkpoint."
    assert "loss_plateau" in lines[3] and lines[4].strip() == "loss stopped improving"


def test_a_resolve_on_a_terminal_is_one_dimmed_line_with_its_reason() -> None:
    out = TtyBuffer()
    AlertPrinter(since=0, out=out)([RESOLVED])
    (line,) = out.getvalue().splitlines()
    assert DIM in line and RED not in line
    assert plain(line).endswith("loss_non_finite  train/loss  step 79  (run finished)")


def test_alerts_off_a_terminal_are_the_plain_timeline_lines(tmp_path: Path) -> None:
    out, jsonl = io.StringIO(), tmp_path / "alerts.jsonl"
    printer = AlertPrinter(since=NOW - 60, out=out, jsonl_path=jsonl)
    printer([FIRED, transition("firing", "warning", wall_time=NOW - 3600), RESOLVED])
    printer.close()
    assert out.getvalue() == format_text(FIRED) + "\n" + format_text(RESOLVED) + "\n"
    assert "\x1b" not in out.getvalue() and printer.hidden == 1
    assert [json.loads(x) for x in jsonl.read_text().splitlines()] == [
        json.loads(json.dumps(t.as_dict())) for t in (FIRED, RESOLVED)
    ]


def test_an_alert_fired_by_the_point_that_recovers_another_joins_its_incident() -> None:
    """As the notifier has it: a loss under the critical's line and over the warning's
    is the incident going on; once every alert of it resolved, a firing starts anew."""
    out = io.StringIO()
    printer = AlertPrinter(since=0, out=out)
    shift = dict(rule="loss_level_shift", message="loss jumped")
    printer([transition("firing", "critical", step=1650, **shift)])
    recovered = transition("resolved", "critical", step=2850, reason="recovered", **shift)
    raised = dict(rule="loss_level_raised", message="loss is up")
    printer([recovered, transition("firing", "warning", step=2850, **raised)])
    printer([transition("resolved", "warning", step=3000, reason="recovered", **raised)])
    printer([transition("firing", "critical", step=4000, rule="loss_divergence", message="up")])
    lines = out.getvalue().splitlines()
    joined = [x for x in lines if "joins the incident" in x]
    assert len(joined) == 1 and "loss_level_raised" in joined[0]
    assert "joins the incident opened by loss_level_shift at step 1650" in joined[0]
    (anew,) = [x for x in lines if "loss_divergence" in x]
    assert "joins" not in anew


def test_no_color_keeps_the_layout_and_drops_the_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    out = TtyBuffer()
    AlertPrinter(since=0, out=out)([FIRED, WARNED])
    assert "\x1b[31m" not in out.getvalue() and "31m" not in out.getvalue()
    assert "33m" not in out.getvalue()
    assert plain(out.getvalue()).splitlines()[1].rstrip() == " " * 10 + FIRED.message


def test_color_never_is_plain_on_a_terminal_and_always_is_rich_in_a_pipe() -> None:
    console.set_color("never")
    on_tty = TtyBuffer()
    AlertPrinter(since=0, out=on_tty)([FIRED])
    assert on_tty.getvalue() == format_text(FIRED) + "\n"
    console.set_color("always")
    piped = io.StringIO()
    AlertPrinter(since=0, out=piped)([FIRED])
    assert f"{RED}FIRING" in piped.getvalue()
    with pytest.raises(ValueError, match="expected one of auto, always, never"):
        console.set_color("sometimes")


def test_replay_in_a_terminal_groups_per_run_and_ends_with_a_summary_table(
    tmp_path: Path,
) -> None:
    root = write_runs(tmp_path / "logs")
    term = PtyProcess("replay", str(root))
    assert term.wait() == 0
    screen = plain(term.output).replace("\r\n", "\n")
    assert f"{RED}FIRING" in term.output and DIM in term.output
    lines = [x.rstrip() for x in screen.splitlines()]
    header = next(i for i, x in enumerate(lines) if x.startswith("logs/exp/bad ─"))
    assert lines[header + 1].split()[2:] == [
        "FIRING", "critical", "loss_non_finite", "loss", "step", "60",
    ]  # fmt: skip
    assert lines[header + 2].strip() == "loss at step 60 is nan"
    assert any(x.endswith("step 79  (run finished)") for x in lines)
    summary = lines.index("summary")
    assert lines[summary + 1].split() == [
        "run", "fired", "warning", "at", "critical", "at", "rules",
    ]  # fmt: skip
    assert lines[summary + 2].split() == ["logs/exp/bad", "1", "-", "step", "60", "loss_non_finite"]
    assert lines[-1] == "1 firing transitions in 1 run(s)"


def test_replay_into_a_pipe_prints_the_plain_timeline(tmp_path: Path) -> None:
    root = write_runs(tmp_path / "logs")
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert "\x1b" not in done.stdout and len(lines) == 4
    assert lines[0].split()[2:] == [
        "logs/exp/bad", "step", "60", "FIRING", "critical", "loss_non_finite", "[loss]",
        "loss", "at", "step", "60", "is", "nan",
    ]  # fmt: skip
    assert lines[1].strip().startswith("runbook: ")
    assert lines[2].split()[2:8] == [
        "logs/exp/bad", "step", "79", "RESOLVED", "critical", "loss_non_finite",
    ]  # fmt: skip
    assert lines[3] == "1 firing transitions in 1 run(s)"


def test_run_in_a_terminal_shows_coloured_alerts_and_then_caught_up(tmp_path: Path) -> None:
    root = write_runs(tmp_path / "logs")
    term = PtyProcess("run", str(root), "--http", "off", "--state-dir", str(tmp_path / "state"))
    try:
        term.read_until("caught up: 2 files, 160 points")
        term.read_until("loss at step 60 is nan")
    finally:
        assert term.stop() == 0
    screen = plain(term.output).replace("\r\n", "\n").splitlines()
    head = next(x for x in screen if "loss_non_finite" in x)
    assert head.split()[1:] == [
        "FIRING", "critical", "exp/bad", "loss_non_finite", "loss", "step", "60",
    ]  # fmt: skip
    assert f"{RED}FIRING" in term.output
    assert screen[-1].startswith("trainsentry: stopped after reading 160 points")


def status_of(port: int, until: str) -> str:
    """`trainsentry status` piped, asked again until the daemon's snapshot shows `until`."""
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [sys.executable, "-m", "trainsentry", "status", "--address", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if until in done.stdout or time.monotonic() > deadline:
            return done.stdout


def test_status_of_a_running_daemon_is_a_table_on_a_terminal_and_lines_in_a_pipe(
    tmp_path: Path,
) -> None:
    root = write_runs(tmp_path / "logs")
    port = free_port()
    args = (str(root), "--http", f"127.0.0.1:{port}", "--state-dir", str(tmp_path / "state"))
    daemon = DaemonProcess(*args, merge_stderr=True)
    try:
        daemon.wait_for_text("caught up")
        piped = status_of(port, "loss_non_finite")
        term = PtyProcess("status", "--address", f"127.0.0.1:{port}")
        assert term.wait() == 0
    finally:
        daemon.stop()
    assert "\x1b" not in piped
    rows = [x.split() for x in piped.splitlines()]
    assert rows[0] == ["RUN", "STEP", "AGE", "FIRING"]
    assert rows[1][:2] == ["exp/bad", "79"]
    assert rows[1][3:] == ["critical", "loss_non_finite", "(loss)"]
    assert rows[2][:2] == ["exp/good", "79"] and rows[2][3:] == ["-"]
    assert rows[3] == ["2", "runs,", "1", "firing", "(1", "critical,", "0", "warning)"]
    assert piped.splitlines()[5].split() == [
        "critical", "exp/bad", "loss_non_finite:", "loss", "at", "step", "79", "is", "nan",
    ]  # fmt: skip
    screen = [x.split() for x in plain(term.output).splitlines() if x.strip()]
    assert screen[0] == ["RUN", "STEP", "AGE", "FIRING"]
    assert screen[1][:2] == ["exp/bad", "79"]
    assert screen[1][3:] == ["critical", "loss_non_finite", "(loss)"]
    assert screen[2][:2] == ["exp/good", "79"] and screen[2][3:] == ["-"]
    assert screen[3] == ["2", "runs,", "1", "firing", "(1", "critical,", "0", "warning)"]
    assert screen[4][:3] == ["critical", "exp/bad", "loss_non_finite:"]
    assert f"{RED}critical" in term.output and "\x1b[36m" in term.output  # run names in cyan


def test_the_demo_in_a_terminal_shows_its_alerts_as_run_does() -> None:
    term = PtyProcess("demo", "--fast")
    assert term.wait() == 0
    lines = [x.rstrip() for x in plain(term.output).replace("\r\n", "\n").splitlines()]
    warning = next(x for x in lines if "FIRING" in x and "warning" in x)
    assert warning.split()[2:] == [
        "FIRING", "warning", "grad_norm_exponential_growth", "train/grad_norm", "step",
        warning.split()[-1],
    ]  # fmt: skip
    assert f"{YELLOW}FIRING" in term.output and f"{RED}ESCALATED" in term.output
    assert max(len(x) for x in lines) <= 120  # wrapped at words by rich, not by the terminal
    assert any(x.startswith("  lead time: ") for x in lines)
