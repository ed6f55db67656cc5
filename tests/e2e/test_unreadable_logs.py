"""The real daemon on log files and directories it may not read, then may.

Root reads everything, so when the tests run as root (CI does) the daemon is
started without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (dropped from its
capability bounding set before exec): it is then held to the permission bits
like any user, while the test, still root, writes the files. Run as another
user, the test needs nothing special. Where neither is possible it is skipped.
"""

from __future__ import annotations

import ctypes
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support.daemon_process import DaemonProcess

PR_CAPBSET_DROP = 24
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2


def _drop_read_override() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@pytest.fixture
def unprivileged() -> Callable[[], None] | None:
    """How to start the daemon so that permission bits bind it."""
    if os.geteuid() != 0:
        return None
    try:
        import subprocess
        import sys

        subprocess.run([sys.executable, "-c", ""], preexec_fn=_drop_read_override, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"running as root and cannot drop CAP_DAC_OVERRIDE: {exc}")
    return _drop_read_override


def write_steps(path: Path, steps: range) -> None:
    with path.open("a") as f:
        f.write("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps))


def start(root: Path, tmp: Path, unprivileged: Callable[[], None] | None) -> DaemonProcess:
    """`run -vv` on `root`, held to the permission bits, its stderr merged for the lines."""
    return DaemonProcess(
        str(root), "-vv", "--state-dir", str(tmp / "state"), "--http", "off",
        merge_stderr=True, preexec_fn=unprivileged,
    )  # fmt: skip


def loss_steps(daemon: DaemonProcess) -> list[int]:
    return [p["step"] for p in daemon.points if p["tag"] == "loss"]


def test_an_unreadable_run_file_is_named_once_and_read_whole_when_permissions_come_back(
    tmp_path: Path, unprivileged: Callable[[], None] | None
) -> None:
    root = tmp_path / "logs"
    (root / "ok").mkdir(parents=True)
    (root / "locked").mkdir()
    locked = root / "locked" / "metrics.jsonl"
    write_steps(root / "ok" / "metrics.jsonl", range(5))
    write_steps(locked, range(10))
    locked.chmod(0o000)
    daemon = start(root, tmp_path, unprivileged)
    try:
        line = daemon.wait_for_text(f"cannot read {locked}")
        assert "Permission denied" in line
        daemon.wait_for_points(5)  # the readable run is read meanwhile
        write_steps(locked, range(10, 20))  # the job keeps writing; the daemon keeps trying
        write_steps(root / "ok" / "metrics.jsonl", range(5, 10))
        daemon.wait_for_points(10)
        locked.chmod(0o644)
        daemon.wait_for_text(f"{locked} can be read again")
        daemon.wait_for_points(30)
    finally:
        daemon.stop()
    output = daemon.clean_output()
    assert output.count(f"cannot read {locked}") == 1, output[-3000:]
    by_run = {
        run: sorted(p["step"] for p in daemon.points if p["run"] == run) for run in ("ok", "locked")
    }
    assert by_run == {"ok": list(range(10)), "locked": list(range(20))}


def test_an_unreadable_log_root_is_named_and_read_once_it_can_be(
    tmp_path: Path, unprivileged: Callable[[], None] | None
) -> None:
    root = tmp_path / "logs"
    (root / "job").mkdir(parents=True)
    write_steps(root / "job" / "metrics.jsonl", range(7))
    root.chmod(0o000)
    daemon = start(root, tmp_path, unprivileged)
    try:
        line = daemon.wait_for_text(f"cannot read {root}")
        assert "Permission denied" in line
        root.chmod(0o755)
        daemon.wait_for_text(f"{root} can be read again")
        daemon.wait_for_points(7)
        write_steps(root / "job" / "metrics.jsonl", range(7, 12))
        daemon.wait_for_points(12)
    finally:
        root.chmod(0o755)
        daemon.stop()
    output = daemon.clean_output()
    assert output.count(f"cannot read {root}") == 1, output[-3000:]
    assert "watch limit" not in output, "the root readable again is watched again"
    assert loss_steps(daemon) == list(range(12))
