"""What the operator reads while state writes fail: once, a reminder, once fixed, no flapping."""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

from support.clock import Clock

from trainsentry.state.db import Checkpoint
from trainsentry.state.disk_full import HeldState, WriteTrouble

FULL = sqlite3.OperationalError("database or disk is full")


def test_a_long_failure_is_said_once_then_reminded_every_ten_minutes() -> None:
    clock, out = Clock(), io.StringIO()
    trouble = WriteTrouble(Path("/state/state.db"), out=out, clock=clock)
    for _ in range(1300):  # one failed write a second for 21 minutes
        trouble.failed(FULL)
        clock.now += 1
    trouble.worked()
    lines = out.getvalue().splitlines()
    assert [line.split(" in /state")[0] for line in lines] == [
        "trainsentry: cannot write the state",
        "trainsentry: the state",
        "trainsentry: the state",
        "trainsentry: the state",
    ]
    assert "still cannot be written (601 writes failed in 600 s)" in lines[1]
    assert "can be written again after 1300 s (1300 writes had failed)" in lines[3]


def test_writes_that_fit_now_and_then_on_a_full_disk_do_not_flap() -> None:
    clock, out = Clock(), io.StringIO()
    trouble = WriteTrouble(Path("/state/state.db"), out=out, clock=clock)
    for _ in range(100):  # fails, fits, fails, fits ...
        trouble.failed(FULL)
        clock.now += 1
        trouble.worked()
        clock.now += 1
    assert len(out.getvalue().splitlines()) == 2  # the first failure and the first recovery


def test_offsets_that_could_not_be_saved_go_with_the_next_save_that_works(tmp_path: Path) -> None:
    out = io.StringIO()
    state = HeldState(tmp_path / "state.db", WriteTrouble(tmp_path, out=out))
    db: sqlite3.Connection = state._db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")  # SQLite's own limit: a real SQLITE_FULL
    wide = b"x" * 64  # fingerprints as wide as the tailer's
    cps = [Checkpoint(f"/logs/run{i}/m.jsonl", 1, i, wide, 10 * i, wide) for i in range(200)]
    state.save_offsets(cps[:100])  # one cycle touched these
    state.save_offsets(cps[100:])  # the next one those
    assert state.held == 200 and "cannot write the state" in out.getvalue()
    db.execute("PRAGMA max_page_count = 1000000")
    state.save_offsets([])  # a cycle that touched nothing
    assert state.held == 0
    assert {p: c.offset for p, c in state.load_offsets().items()} == {c.path: c.offset for c in cps}
    assert "can be written again" in out.getvalue()
