"""When the inotify watch limit is used up, the daemon notices, says so once, and polls."""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from support.in_process import into, read_until, write_points
from watchdog.observers.api import BaseObserver

from trainsentry.point import Point
from trainsentry.runtime import loop as runtime
from trainsentry.runtime.loop import DEFAULT_POLL_SECONDS, SAFETY_SWEEP_SECONDS, Daemon
from trainsentry.state.db import StateDB
from trainsentry.watching import new_watcher
from trainsentry.watching.inotify import InotifyTree
from trainsentry.watching.kernel import inotify_watches, limit_advice, watch_shortfall


def tree(root: Path) -> Path:
    """root, a, a/seed0, b, plus .git and a control dir that sweeps do not walk."""
    write_points(root / "a" / "seed0" / "m.jsonl", range(3))
    (root / "b").mkdir()
    (root / ".git" / "objects").mkdir(parents=True)
    (root / "a" / ".trainsentry").mkdir()
    return root


def test_shortfall_is_directories_without_a_watch() -> None:
    assert watch_shortfall(10, 10) == 0
    assert watch_shortfall(10, 14) == 0  # .git and control dirs are watched, not counted
    assert watch_shortfall(10, 7) == 3
    assert watch_shortfall(10, None) == 0  # no /proc: unknown is not deaf


def test_advice_names_the_sysctl_with_headroom() -> None:
    advice = limit_advice(524288, directories=400_000)
    assert "sysctl fs.inotify.max_user_watches=1324288" in advice
    assert "max_user_watches=524288" in limit_advice(None)


def test_a_sweep_counts_the_directories_it_walks(tmp_path: Path) -> None:
    root = tree(tmp_path / "logs")
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [], poll=60)
    assert daemon.stats.directories is None
    daemon.start()
    try:
        assert daemon.stats.directories == 4
        (root / "c" / "d").mkdir(parents=True)
        daemon.sweep()
        assert daemon.stats.directories == 6
    finally:
        daemon.close()


def test_a_healthy_tree_holds_a_watch_for_every_directory_it_walks(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tree(tmp_path / "logs")
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [])
    daemon.start()
    try:
        watches = inotify_watches()
        assert watches is not None and daemon.stats.directories is not None
        assert watches >= daemon.stats.directories
        assert daemon.sweep_interval() == SAFETY_SWEEP_SECONDS
    finally:
        daemon.close()
    assert "watch limit" not in caplog.text


def test_directories_made_since_the_last_read_are_not_taken_for_a_watch_shortfall(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The watches of new directories are added when their events are read: a
    # sweep that walks them first must let that happen before it counts (a fleet
    # starting beside a busy root once fell back to polling for good this way).
    root = tree(tmp_path / "logs")
    got: list[Point] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [into(got)])
    daemon.start()
    try:
        for i in range(20):
            (root / f"new{i}" / "seed0").mkdir(parents=True)
        with caplog.at_level(logging.WARNING, logger="trainsentry"):
            daemon.sweep()
        assert daemon.stats.directories == 4 + 40
        assert daemon.sweep_interval() == SAFETY_SWEEP_SECONDS
        write_points(root / "new7" / "seed0" / "m.jsonl", range(2))
        read_until(daemon, got, 5)  # seen through the watch added late, not a sweep
    finally:
        daemon.close()
    assert "watch limit" not in caplog.text
    assert sorted((p.run, p.step) for p in got)[-2:] == [("new7/seed0", 0), ("new7/seed0", 1)]


def test_changes_read_while_catching_up_are_handed_out_by_the_next_take(tmp_path: Path) -> None:
    root = tree(tmp_path / "logs")
    watcher = new_watcher()
    watcher.watch([root])
    try:
        (root / "c").mkdir()
        write_points(root / "a" / "seed0" / "m.jsonl", range(3, 4))
        watcher.catch_up()
        changes = watcher.take()
        assert str(root / "c") in changes.dirs
        assert str(root / "a" / "seed0" / "m.jsonl") in changes.files
        assert not watcher.take().files
    finally:
        watcher.stop()


def test_a_root_the_kernel_refuses_to_watch_is_polled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "inotify watch limit reached")

    monkeypatch.setattr(InotifyTree, "add_tree", refuse)
    monkeypatch.setattr(BaseObserver, "schedule", refuse)  # where watchdog is the backend
    root = tree(tmp_path / "logs")
    got: list[Point] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [into(got)])
    with caplog.at_level(logging.WARNING, logger="trainsentry"):
        daemon.start()
    try:
        assert daemon.sweep_interval() == DEFAULT_POLL_SECONDS
        assert "the inotify watch limit is used up" in caplog.text
        assert "sysctl fs.inotify.max_user_watches=" in caplog.text
        write_points(root / "b" / "seed1" / "m.jsonl", range(5))
        read_until(daemon, got, 8)
    finally:
        daemon.close()
    assert sorted((p.run, p.step) for p in got) == [("a/seed0", s) for s in range(3)] + [
        ("b/seed1", s) for s in range(5)
    ]


def test_a_tree_short_of_watches_falls_back_to_polling_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # What watchdog does at the limit: the root is watched, the rest silently not.
    monkeypatch.setattr(runtime, "inotify_watches", lambda: 1)
    monkeypatch.setattr(runtime, "WATCH_GRACE_SECONDS", 0.0)
    root = tree(tmp_path / "logs")
    got: list[Point] = []
    daemon = Daemon([root], StateDB(tmp_path / "state.db"), [into(got)])
    with caplog.at_level(logging.WARNING, logger="trainsentry"):
        daemon.start()
        try:
            assert daemon.sweep_interval() == DEFAULT_POLL_SECONDS
            write_points(root / "a" / "seed0" / "m.jsonl", range(3, 6))
            read_until(daemon, got, 6)
            daemon.sweep()
        finally:
            daemon.close()
    warnings = [r for r in caplog.records if "watch limit reached" in r.getMessage()]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "4 directories" in message and "only 1 watches" in message
    assert "polled every 2 s" in message and "sysctl fs.inotify.max_user_watches=" in message
    assert [p.step for p in got] == list(range(6))
