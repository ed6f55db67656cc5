"""The live daemon against real writers running in other processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess
from support.in_process import into
from support.paths import SUPPORT

from trainsentry.point import Point
from trainsentry.runtime.loop import Daemon
from trainsentry.state.db import StateDB

N = 400


def start_writer(kind: str, logdir: Path, n: int = N) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SUPPORT / "writer_proc.py"), kind, str(logdir), str(n)],
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize("kind", ["torch", "tbx", "jsonl"])
def test_points_from_a_live_writer_arrive_once_and_in_order(tmp_path: Path, kind: str) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    got: list[Point] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [into(got)])
    daemon.start()
    writer = start_writer(kind, root / "job")
    try:
        while writer.poll() is None:
            daemon.cycle(timeout=0.2)
        for _ in range(50):  # the tail end, written after the last event we saw
            if len(got) >= 2 * N:
                break
            daemon.cycle(timeout=0.2)
    finally:
        daemon.close()
    assert writer.returncode == 0
    losses = [p.step for p in got if p.tag == "loss"]
    assert losses == list(range(N))
    assert {p.run for p in got} == {"job"}
    assert len(got) == 2 * N


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_daemon_stopped_mid_file_resumes_where_it_stopped(tmp_path: Path, sig: int) -> None:
    root, state = tmp_path / "logs", tmp_path / "state"
    (root / "job").mkdir(parents=True)
    n = 3000
    daemon = DaemonProcess(str(root), "-vv", "--state-dir", str(state))
    writer = start_writer("jsonl", root / "job", n)
    daemon.wait_for_points(300)  # the writer is mid-file now
    first = daemon.stop(sig)
    assert writer.wait(timeout=60) == 0
    daemon = DaemonProcess(str(root), "-vv", "--state-dir", str(state))
    try:
        daemon.wait_for_points(2 * n - len(first))
    finally:
        second = daemon.stop()
    seen = Counter((p["tag"], p["step"]) for p in first + second)
    assert set(seen) == {(tag, s) for tag in ("loss", "grad_norm") for s in range(n)}
    if sig == signal.SIGTERM:
        assert max(seen.values()) == 1  # a clean stop repeats nothing
    else:
        # a kill -9 may repeat the one cycle whose offsets were not committed
        assert max(seen.values()) <= 2
        assert sum(c - 1 for c in seen.values()) <= len(first)


def test_new_runs_created_after_start_are_discovered(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    got: list[Point] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [into(got)])
    daemon.start()
    try:
        for name in ("a/seed0", "b/seed1/deeper"):
            writer = start_writer("jsonl", root / name, 5)
            assert writer.wait(timeout=60) == 0
        for _ in range(50):
            if len(got) >= 20:
                break
            daemon.cycle(timeout=0.2)
    finally:
        daemon.close()
    assert Counter(p.run for p in got) == {"a/seed0": 10, "b/seed1/deeper": 10}


def test_deleted_run_is_released(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    (root / "gone").mkdir(parents=True)
    (root / "gone" / "m.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    released: list[str] = []
    daemon = Daemon(
        [root], StateDB(tmp_path / "state.db"), [lambda run, rows: None], on_release=released.append
    )
    daemon.start()
    try:
        os.remove(root / "gone" / "m.jsonl")
        for _ in range(50):
            if released:
                break
            daemon.cycle(timeout=0.2)
    finally:
        daemon.close()
    assert released == ["gone"]


def test_polling_mode_reads_without_inotify(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    (root / "job").mkdir(parents=True)
    got: list[Point] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [into(got)], poll=0.05)
    daemon.start()
    try:
        writer = start_writer("jsonl", root / "job", 20)
        assert writer.wait(timeout=60) == 0
        for _ in range(100):
            if len(got) >= 40:
                break
            daemon.cycle()
    finally:
        daemon.close()
    assert len(got) == 40


def test_a_firing_leaves_its_plot_beside_the_incident_bundle_with_no_receiver(
    tmp_path: Path,
) -> None:
    """The evidence is for the person who looks the next morning, notified or not."""
    run = tmp_path / "logs" / "exp"
    run.mkdir(parents=True)
    lines = [f'{{"step": {s}, "loss": {2.0 - s / 100}}}' for s in range(50)]
    (run / "metrics.jsonl").write_text("\n".join([*lines, '{"step": 50, "loss": NaN}']) + "\n")
    state = tmp_path / "state"
    daemon = DaemonProcess(
        str(tmp_path / "logs"), "--state-dir", str(state), "--http", "off", "--history", "all",
        merge_stderr=True,
    )  # fmt: skip
    png = state / "incidents" / "exp" / "loss_non_finite-50.png"
    try:
        daemon.wait_for_text("loss_non_finite")
        daemon.wait_until(lambda: png.exists(), timeout=120)  # drawn in a child process
    finally:
        daemon.stop()
    assert png.read_bytes().startswith(b"\x89PNG")
    assert png.with_suffix(".json").exists()
