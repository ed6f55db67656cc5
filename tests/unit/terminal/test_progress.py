"""Startup over large existing logs says how far it is, then that it caught up."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.clock import Clock
from support.in_process import into
from support.pty_process import TtyBuffer, plain, screen_lines, terminal_env

from trainsentry.alert import Transition
from trainsentry.point import Point, Row, points_of
from trainsentry.runtime import loop as runtime
from trainsentry.runtime.loop import Daemon
from trainsentry.sources import tail
from trainsentry.state.db import StateDB
from trainsentry.terminal.printer import AlertPrinter
from trainsentry.terminal.progress import Backfill, BackfillReporter, human_count


def step(done: int, points: int, seconds: float, *, finished: bool = False) -> Backfill:
    return Backfill(files_done=done, files_total=40, points=points, seconds=seconds, done=finished)


def write_log(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for s in range(n):
            f.write(json.dumps({"step": s, "loss": 1.0, "lr": 0.1}) + "\n")


def test_counts_read_at_a_glance() -> None:
    assert [human_count(n) for n in (950, 12_345, 1_234_567, 3_000_000_000)] == [
        "950",
        "12.3k",
        "1.2M",
        "3.0G",
    ]


def test_a_log_gets_a_line_every_few_seconds_then_caught_up() -> None:
    out, clock = io.StringIO(), Clock()
    report = BackfillReporter(out, every=5.0, clock=clock)
    for t, done, points in [(1, 2, 10_000), (5.2, 12, 1_200_000), (7, 20, 2_000_000)]:
        clock.now = t
        report(step(done, points, t))
    clock.now = 10.4
    report(step(31, 3_100_000, 10.4))
    report(step(40, 4_000_000, 12.0, finished=True))
    assert out.getvalue().splitlines() == [
        "trainsentry: backfill: 12/40 files, 1.2M points, 5.2 s",
        "trainsentry: backfill: 31/40 files, 3.1M points, 10.4 s",
        "trainsentry: caught up: 40 files, 4.0M points in 12.0 s",
    ]


def test_a_terminal_gets_a_progress_bar_redrawn_in_place_then_caught_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal_env(monkeypatch, columns=100)
    out, clock = TtyBuffer(), Clock()
    report = BackfillReporter(out, clock=clock)
    for t in (0.1, 0.3, 0.45, 0.6):  # 0.45: within 0.2 s of the last draw, skipped
        clock.now = t
        report(step(int(t * 40), int(t * 1e6), t))
    drawn = out.getvalue()
    assert "\n" not in drawn  # the bar stays on its one line
    frames = [plain(f).strip() for f in drawn.split("\r") if plain(f).strip()]
    assert [f.split("━")[0].strip() for f in frames] == ["trainsentry: backfill"] * 2
    assert frames[-1].endswith("24/40 files, 600.0k points, 0.6 s")
    report(step(40, 1_000_000, 1.0, finished=True))
    assert screen_lines(out.getvalue()) == [  # the bar gives way to the summary line
        "trainsentry: caught up: 40 files, 1.0M points in 1.0 s",
        "",
    ]
    hidden, shown = out.getvalue().count("\x1b[?25l"), out.getvalue().count("\x1b[?25h")
    assert hidden == shown == 1  # the cursor is given back


def test_an_alert_during_the_backfill_is_printed_above_the_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal_env(monkeypatch)
    screen, clock = TtyBuffer(), Clock()  # stdout and stderr on one terminal
    report = BackfillReporter(screen, clock=clock)
    printer = AlertPrinter(since=0, out=screen)
    clock.now = 0.3
    report(step(10, 100_000, 0.3))
    alert = Transition(
        run="exp1", rule="loss_non_finite", severity="critical", state="firing", step=60,
        wall_time=0, metric="loss", value=float("nan"), message="loss at step 60 is nan",
    )  # fmt: skip
    printer([alert])
    clock.now = 0.6
    report(step(20, 200_000, 0.6))
    lines = screen_lines(screen.getvalue())
    assert lines[0].split()[:4] == ["-", "FIRING", "critical", "exp1"]  # not after the bar
    assert lines[1].strip() == "loss at step 60 is nan"
    assert lines[2].startswith("trainsentry: backfill")
    assert lines[2].endswith("20/40 files, 200.0k points, 0.6 s")
    assert len(lines) == 3


def test_the_daemon_reports_each_file_read_to_its_end_then_caught_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "READ_BUDGET", 8192)  # a backfill of several cycles
    monkeypatch.setattr(tail, "READ_CHUNK", 4096)
    root = tmp_path / "logs"
    write_log(root / "big" / "m.jsonl", 2000)
    write_log(root / "small" / "m.jsonl", 10)
    seen: list[Backfill] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [], poll=60)
    daemon.on_backfill = seen.append
    daemon.start()
    try:
        while not seen[-1].done:
            daemon.cycle(timeout=0)
        daemon.cycle(timeout=0)  # live from here: nothing more is reported
    finally:
        daemon.close()
    assert [b.files_done for b in seen if not b.done][:2] == [0, 1]  # big first, unfinished
    assert sum(b.done for b in seen) == 1
    last = seen[-1]
    assert (last.files_done, last.files_total, last.points) == (2, 2, 2 * 2010)
    assert [b.points for b in seen] == sorted(b.points for b in seen)


def test_the_service_logs_caught_up_when_not_on_a_terminal(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    write_log(root / "job" / "m.jsonl", 500)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainsentry",
            "run",
            str(root),
            "--http",
            "off",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if "caught up" in line:
                break
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert line == "trainsentry: caught up: 1 files, 1.0k points in " + line.split(" in ")[1]


def test_a_stop_during_the_backfill_ends_it_and_leaves_the_rest_for_the_next_start(
    tmp_path: Path,
) -> None:
    root = tmp_path / "logs"
    for name in ("a", "b", "c"):
        write_log(root / name / "m.jsonl", 100)
    read: list[tuple[str, int]] = []
    backfills: list[Backfill] = []

    def then_stop(run: str, rows: list[Row]) -> None:  # as Ctrl-C after the first file
        read.append((run, len(points_of(run, rows))))
        first.stop()

    first = Daemon([root], StateDB(tmp_path / "state.db"), [then_stop], poll=60)
    first.on_backfill = backfills.append
    first.start()
    first.close()
    assert read == [("a", 200)]  # loss and lr
    assert not any(b.done for b in backfills)  # not "caught up": it was not
    assert backfills[-1].stopped and (backfills[-1].files_done, backfills[-1].files_total) == (1, 3)
    out = io.StringIO()
    BackfillReporter(out)(backfills[-1])
    assert out.getvalue() == (
        "trainsentry: backfill stopped at 1/3 files, 200 points; "
        "the rest is read at the next start\n"
    )
    rest: list[Point] = []
    second = Daemon([root], StateDB(tmp_path / "state.db"), [into(rest)], poll=60)
    second.start()
    second.close()
    assert sorted({p.run for p in rest}) == ["b", "c"] and len(rest) == 400
