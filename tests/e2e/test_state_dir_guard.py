"""The real daemon against its own state dir: a second daemon on it refuses while the
first runs on, a lock left by a `kill -9` is taken over, and a damaged `state.db` or
`alert-state.snapshot` is moved aside and said (or, where nothing can be moved, the
daemon stops with the command that recovers and a status systemd does not restart on)."""

from __future__ import annotations

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess, saved_alert_state

from trainsentry.runtime.restart import SNAPSHOT_FILE
from trainsentry.state.damage import UNUSABLE_EXIT_STATUS
from trainsentry.state.dir_lock import IN_USE_EXIT_STATUS, LOCK_FILE


def write_job(root: Path, steps: range, nan_at: int | None = None) -> Path:
    log = root / "r1" / "metrics.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        for step in steps:
            loss = "NaN" if step == nan_at else "1.0"
            f.write(f'{{"step": {step}, "loss": {loss}}}\n')
    return log


def start(root: Path, state: Path) -> DaemonProcess:
    return DaemonProcess(str(root), "--state-dir", str(state), "--http", "off", merge_stderr=True)


def run_once(root: Path, state: Path) -> subprocess.CompletedProcess[str]:
    """A daemon expected to refuse: it must end by itself."""
    argv = ["run", str(root), "--state-dir", str(state), "--http", "off"]
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )


def firings(daemon: DaemonProcess) -> list[str]:
    return [line for line in daemon.lines if "FIRING" in line and "loss_non_finite" in line]


def test_a_second_daemon_refuses_the_state_dir_and_a_killed_ones_lock_is_taken_over(
    tmp_path: Path,
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    write_job(root, range(10))
    first = start(root, state)
    try:
        first.wait_for_text("caught up")
        second = run_once(root, state)
        assert second.returncode == IN_USE_EXIT_STATUS, second.stderr
        said = second.stderr.strip().splitlines()[-1]
        host = re.escape(socket.gethostname())
        assert re.fullmatch(
            rf"trainsentry: state dir {re.escape(str(state))} is in use by PID {first.proc.pid}"
            rf" on {host} since \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{{4}}; stop that daemon "
            r"first, or give this one a state dir of its own \(--state-dir, state_dir\)",
            said,
        ), said
        assert "watching" not in second.stdout  # it never started
        # the first runs on, reading and alerting as before
        write_job(root, range(10, 12), nan_at=11)
        first.wait_until(lambda: len(firings(first)) == 1, what="the first daemon's NaN alert")
        assert first.proc.poll() is None
    finally:
        first.stop(signal.SIGKILL)
    held = (state / LOCK_FILE).read_text()
    assert f"pid={first.proc.pid}\n" in held  # the record a kill -9 leaves behind

    write_job(root, range(12, 14))
    third = start(root, state)
    try:
        third.wait_for_text("caught up")
        taken = third.wait_for_text("taken over")
        assert taken.startswith(
            f"trainsentry: state dir {state} was left locked by PID {first.proc.pid} on "
            f"{socket.gethostname()} since "
        ), taken
        assert taken.rstrip().endswith("which ended without a clean stop; taken over"), taken
        assert f"pid={third.proc.pid}\n" in (state / LOCK_FILE).read_text()
        assert run_once(root, state).returncode == IN_USE_EXIT_STATUS  # now held by the third
    finally:
        third.stop()
    third.clean_output()
    assert (state / LOCK_FILE).read_text() == ""  # a clean stop leaves no holder named


def damage_db(path: Path, how: str) -> bytes:
    """Damage state.db as a user, a disk or a bad copy would; the bytes left in it."""
    if how == "random bytes":
        path.write_bytes(os.urandom(64 * 1024))
    elif how == "emptied":
        path.write_bytes(b"")
    else:  # malformed: SQLite's header kept, the pages after it overwritten
        data = bytearray(path.read_bytes())
        assert len(data) > 4096
        data[100:] = b"\xa5" * (len(data) - 100)
        path.write_bytes(bytes(data))
    return path.read_bytes()


def warning_of(daemon: DaemonProcess, path: Path) -> str:
    return daemon.wait_for_text(f"WARNING {path} is damaged (")


@pytest.mark.parametrize("how", ["random bytes", "emptied", "malformed"])
def test_a_damaged_state_db_is_moved_aside_said_and_reading_resumes_from_the_snapshot(
    tmp_path: Path, how: str
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    write_job(root, range(50), nan_at=40)
    first = start(root, state)
    first.wait_until(lambda: len(firings(first)) == 1, what="the NaN alert")
    first.wait_for_text("caught up")
    first.stop()
    first.clean_output()
    db = state / "state.db"
    damaged = damage_db(db, how)

    write_job(root, range(50, 60))
    second = start(root, state)
    try:
        line = warning_of(second, db)
        # only the 10 points written since: the rest was read before the snapshot
        assert "caught up: 1 files, 10 points" in second.wait_for_text("caught up")
        second.wait_for_text("restored the alert state (")
    finally:
        second.stop()
    output = second.clean_output()
    reason = {
        "random bytes": "file is not a database",
        "emptied": "it holds no tables: an emptied file",
        "malformed": "database disk image is malformed",
    }[how]
    kept = sorted(state.glob("state.db.damaged-*"))
    assert [p.name for p in kept if not p.name.endswith(("-wal", "-shm"))] == [kept[0].name]
    assert re.fullmatch(r"state\.db\.damaged-\d{8}T\d{6}Z", kept[0].name), kept
    assert kept[0].read_bytes() == damaged  # kept as it was found
    assert line.rstrip().endswith(
        f"WARNING {db} is damaged ({reason}); moved aside to {kept[0]}. Lost with it: the "
        "read offsets, the notifications not yet sent and the sent log. Logs are read again "
        "from the alert-state snapshot's positions, or from their start without one, so "
        "alerts already delivered may be sent again."
    ), line
    # resumed where the snapshot stopped: the NaN at step 40 is not alerted again
    assert firings(second) == [], output[-3000:]
    with sqlite3.connect(db) as fresh:  # a new, whole state.db, with the file's offset
        assert fresh.execute("SELECT offset FROM offsets").fetchall() == [
            ((root / "r1" / "metrics.jsonl").stat().st_size,)
        ]


def test_a_garbage_snapshot_is_moved_aside_said_and_the_state_relearned(tmp_path: Path) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    write_job(root, range(50), nan_at=40)
    first = start(root, state)
    first.wait_until(lambda: len(firings(first)) == 1, what="the NaN alert")
    first.stop()
    first.clean_output()
    snapshot = state / SNAPSHOT_FILE
    garbage = os.urandom(4096)
    snapshot.write_bytes(b"\x80\x05" + garbage)

    second = start(root, state)
    try:
        line = warning_of(second, snapshot)
        second.wait_for_text("caught up")
    finally:
        second.stop()
    output = second.clean_output()
    kept = list(state.glob(f"{SNAPSHOT_FILE}.damaged-*"))
    assert len(kept) == 1 and kept[0].read_bytes() == b"\x80\x05" + garbage
    assert re.search(
        rf"WARNING {re.escape(str(snapshot))} is damaged \(\w+Error: .*\); moved aside to "
        rf"{re.escape(str(kept[0]))}\. Lost with it: the alert state \(rule windows, pending "
        r"and firing alerts, who was told\); it is relearned from the logs, read again from "
        r"their start, so an alert that fired before may be told again\.$",
        line.rstrip(),
    ), line
    assert "restored the alert state" not in output  # relearned instead, told no one again
    assert firings(second) == [], output[-3000:]
    assert saved_alert_state(state) is not None  # a whole one saved at the clean stop


def test_a_state_db_that_cannot_be_moved_aside_stops_the_daemon_with_the_command_that_recovers(
    tmp_path: Path,
) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    write_job(root, range(5))
    (state / "state.db").mkdir(parents=True)  # not a file: not the daemon's to move
    (state / "state.db" / "someones.txt").write_text("kept")
    refused = run_once(root, state)
    assert refused.returncode == UNUSABLE_EXIT_STATUS, refused.stderr
    said = refused.stderr.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"trainsentry: {re.escape(str(state / 'state.db'))} is not a regular file, so the "
        r"state cannot be kept there; recover with `(mv [^`]+)` and start trainsentry again",
        said,
    )
    assert match, said
    assert (state / "state.db" / "someones.txt").read_text() == "kept"  # untouched
    subprocess.run(match.group(1), shell=True, check=True)  # the advice, as given
    daemon = start(root, state)
    try:
        daemon.wait_for_text("caught up")
    finally:
        daemon.stop()
    daemon.clean_output()
    assert (state / "state.db").is_file()
