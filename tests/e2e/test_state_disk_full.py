"""The real daemon with its state dir on a disk that fills up, then has room again.

The disk is real: a 1 MiB tmpfs mounted as the state dir, filled with a
file until the kernel answers ENOSPC, so SQLite's writes fail with
SQLITE_FULL ("database or disk is full") exactly as on a full partition.
Mounting needs root (CI runs as root); elsewhere the test is skipped.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess, saved_alert_state
from support.loss_log import RULES, delivered, write_chunk
from support.notify_endpoints import HttpReceiver, Request
from support.state_db import committed_offset, confirmed
from support.waiting import wait_until

from trainsentry.runtime.restart import SNAPSHOT_FILE


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "state"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs as a full disk needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Write until the filesystem says ENOSPC: nothing more fits."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as f:
        while True:
            try:
                f.write(b"\0" * 4096)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                return filler


def alerts_of(requests: list[Request]) -> set[tuple[str, int]]:
    return {a for r in requests for a in delivered(r)}


def test_a_full_state_disk_keeps_alerting_and_recovers_when_space_is_back(
    tmp_path: Path, small_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINSENTRY_SNAPSHOT_INTERVAL", "1")  # the alert state too
    (tmp_path / "rules.yaml").write_text(RULES)
    log = tmp_path / "logs" / "exp1" / "metrics.jsonl"
    log.parent.mkdir(parents=True)
    alerts = tmp_path / "alerts.jsonl"
    receiver = HttpReceiver()
    daemon = DaemonProcess(
        str(tmp_path / "logs"),
        "--state-dir", str(small_disk),
        "--rules", str(tmp_path / "rules.yaml"),
        "--alerts-jsonl", str(alerts),
        "--notify", f"json://{receiver.url}/hook",
        "--group-interval", "0",  # the resolve told at once
        "--http", "off",
        merge_stderr=True,
    )  # fmt: skip
    try:
        write_chunk(log, range(0, 10), {3})
        assert receiver.wait_for(lambda reqs: ("firing", 3) in alerts_of(reqs))
        filler = fill(small_disk)

        write_chunk(log, range(10, 20), {13})
        daemon.wait_for_text("cannot write the state in")
        daemon.wait_for_text("could not save the alert state: [Errno 28] No space left")
        # alerting goes on: the terminal, the JSONL file and the receiver all get step 13
        assert receiver.wait_for(lambda reqs: {("firing", 13), ("resolved", 14)} <= alerts_of(reqs))
        daemon.wait_for_text("at step 14")
        assert '"step": 13' in alerts.read_text()
        assert daemon.proc.poll() is None
        write_chunk(log, range(20, 30), {23})
        assert receiver.wait_for(lambda reqs: ("firing", 23) in alerts_of(reqs))
        behind = committed_offset(small_disk / "state.db", log)
        assert behind is None or behind < log.stat().st_size

        filler.unlink()
        daemon.wait_for_text("can be written again")
        size = log.stat().st_size
        wait_until(lambda: committed_offset(small_disk / "state.db", log) == size, "offset saved")
        wait_until(
            lambda: (
                {("firing", 13), ("resolved", 14), ("firing", 23)}
                <= confirmed(small_disk / "state.db")
            ),
            "the notifications sent while the disk was full are recorded as sent",
        )
    finally:
        daemon.stop()
        receiver.close()
    output = daemon.clean_output()
    assert output.count("cannot write the state in") == 1, output[-3000:]
    # the alert state saved at the stop, whole, and no half-written one left beside it
    saved = saved_alert_state(small_disk)
    assert saved is not None and saved.offsets[str(log)].offset == log.stat().st_size
    assert sorted(p.name for p in small_disk.iterdir() if "snapshot" in p.name) == [SNAPSHOT_FILE]
    got = [a for r in receiver.requests for a in delivered(r)]
    assert len(got) == len(set(got)), "a notification was sent twice"
