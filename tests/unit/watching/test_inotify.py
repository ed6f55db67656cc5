"""The daemon's own inotify reader, against the real kernel: which paths it
reports, which directories it watches, and what happens when the kernel's
queue overflows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.in_process import following, read_until, write_points

from trainsentry.runtime import loop as runtime
from trainsentry.sources.discover import Root
from trainsentry.watching.inotify import InotifyTree
from trainsentry.watching.watchdog_backend import WatchdogWatcher
from trainsentry.watching.watcher import Changes


def append(path: Path, text: str = "x\n") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(text)


def changes(tree: InotifyTree) -> Changes:
    assert tree.wait(5.0), "no event within 5 s"
    return tree.read(Changes())


@pytest.fixture
def tree() -> object:
    t = InotifyTree()
    yield t
    t.close()


def test_an_append_anywhere_in_the_tree_is_reported_by_path(
    tmp_path: Path, tree: InotifyTree
) -> None:
    append(tmp_path / "a" / "seed0" / "m.jsonl")
    tree.add_tree(str(tmp_path))
    append(tmp_path / "a" / "seed0" / "m.jsonl")
    got = changes(tree)
    assert got.files == {str(tmp_path / "a" / "seed0" / "m.jsonl")}
    assert not got.dirs and not got.overflow
    assert not tree.wait(0.05)  # the read took everything queued


def test_writes_are_not_relinks_but_a_rename_over_a_file_and_a_delete_are(
    tmp_path: Path, tree: InotifyTree
) -> None:
    """A path named only by writes still names the file a tail has open (runtime.py)."""
    log = tmp_path / "run" / "m.jsonl"
    append(log)
    tree.add_tree(str(tmp_path))
    append(log)
    append(log)
    got = changes(tree)
    assert got.files == {str(log)} and not got.relinked
    fresh = tmp_path / "run" / "m.jsonl.tmp"
    fresh.write_text("y\n")
    os.replace(fresh, log)  # a writer that rewrites its log whole
    got = changes(tree)
    assert str(log) in got.relinked
    log.unlink()
    assert str(log) in changes(tree).relinked
    (tmp_path / "run").rename(tmp_path / "moved")
    assert {str(tmp_path / "run"), str(tmp_path / "moved")} <= changes(tree).relinked


def test_directories_made_after_the_watch_are_watched_before_they_are_listed(
    tmp_path: Path, tree: InotifyTree
) -> None:
    tree.add_tree(str(tmp_path))
    (tmp_path / "new" / "a" / "b").mkdir(parents=True)  # faster than any event is read
    got = changes(tree)
    assert str(tmp_path / "new") in got.dirs
    append(tmp_path / "new" / "a" / "b" / "m.jsonl")
    assert str(tmp_path / "new" / "a" / "b" / "m.jsonl") in changes(tree).files


def test_a_renamed_directory_reports_its_new_paths_only(tmp_path: Path, tree: InotifyTree) -> None:
    append(tmp_path / "old" / "sub" / "m.jsonl")
    tree.add_tree(str(tmp_path))
    append(tmp_path / "old" / "sub" / "m.jsonl")  # its path is remembered for the next events
    assert changes(tree).files == {str(tmp_path / "old" / "sub" / "m.jsonl")}
    os.rename(tmp_path / "old", tmp_path / "new")
    got = changes(tree)
    assert {str(tmp_path / "old"), str(tmp_path / "new")} <= got.dirs
    append(tmp_path / "new" / "sub" / "m.jsonl")
    assert changes(tree).files == {str(tmp_path / "new" / "sub" / "m.jsonl")}


def test_a_directory_moved_out_of_the_tree_is_forgotten(tmp_path: Path, tree: InotifyTree) -> None:
    watched, outside = tmp_path / "watched", tmp_path / "outside"
    append(watched / "run" / "sub" / "m.jsonl")
    outside.mkdir()
    tree.add_tree(str(watched))
    before = tree.watches
    os.rename(watched / "run", outside / "run")
    changes(tree)
    assert tree.watches == before - 2
    append(outside / "run" / "sub" / "m.jsonl")
    assert not tree.wait(0.1)


def test_it_watches_what_a_sweep_walks(tmp_path: Path, tree: InotifyTree) -> None:
    """Watches and walked directories are compared to detect the watch limit."""
    for d in ("a/seed0", "a/seed1/x", "b", ".git/objects", "a/.trainsentry"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    tree.add_tree(str(tmp_path))
    _, walked = Root.watched(tmp_path).walk()
    assert tree.watches == walked == 6
    append(tmp_path / ".git" / "objects" / "pack")
    append(tmp_path / "a" / ".trainsentry" / "STOP")
    assert not tree.wait(0.1)


def flood(directory: Path) -> None:
    """More events than the kernel queues for a reader that is not reading."""
    limit = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    # the kernel merges an event identical to the last one queued: alternate two files
    fds = [os.open(directory / n, os.O_WRONLY | os.O_CREAT) for n in ("noise.a", "noise.b")]
    try:
        for i in range(limit + 100):
            os.write(fds[i % 2], b"x")
    finally:
        for fd in fds:
            os.close(fd)


def test_a_queue_overflow_is_reported(tmp_path: Path, tree: InotifyTree) -> None:
    tree.add_tree(str(tmp_path))
    flood(tmp_path)
    assert changes(tree).overflow


def test_after_an_overflow_the_daemon_reads_every_file(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    for run in ("a", "b"):
        write_points(root / run / "m.jsonl", range(1))
    with following(root, tmp_path) as (daemon, got):
        read_until(daemon, got, 2)
        flood(root)
        # written after the queue is full: no event says so
        for run in ("a", "b"):
            write_points(root / run / "m.jsonl", range(1, 3))
        read_until(daemon, got, 6, cycles=100)
    assert sorted((p.run, p.step) for p in got) == [(r, s) for r in "ab" for s in range(3)]


def test_the_watchdog_backend_follows_a_live_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the platform has no inotify: new runs and appends still arrive by event."""
    monkeypatch.setattr(runtime, "new_watcher", WatchdogWatcher)
    monkeypatch.setattr(runtime, "SAFETY_SWEEP_SECONDS", 3600.0)  # events only
    root = tmp_path / "logs"
    write_points(root / "a" / "m.jsonl", range(2))
    with following(root, tmp_path) as (daemon, got):
        read_until(daemon, got, 2)
        write_points(root / "a" / "m.jsonl", range(2, 4))
        write_points(root / "b" / "deep" / "m.jsonl", range(3))
        read_until(daemon, got, 7)
    assert sorted((p.run, p.step) for p in got) == [("a", s) for s in range(4)] + [
        ("b/deep", s) for s in range(3)
    ]


def test_a_root_deleted_and_made_again_is_watched_again(tmp_path: Path) -> None:
    """A scratch log dir wiped and recreated: its new runs arrive by event, not by sweep."""
    root = tmp_path / "logs"
    write_points(root / "a" / "m.jsonl", range(2))
    with following(root, tmp_path) as (daemon, got):
        read_until(daemon, got, 2)
        shutil.rmtree(root)
        read_until(daemon, got, 3, cycles=5)  # the deletion is read
        write_points(root / "b" / "m.jsonl", range(3))
        read_until(daemon, got, 5)  # inside the 30 s before a safety sweep
        write_points(root / "b" / "m.jsonl", range(3, 4))
        read_until(daemon, got, 6)
    assert sorted((p.run, p.step) for p in got) == [("a", 0), ("a", 1)] + [
        ("b", s) for s in range(4)
    ]


def test_a_file_replaced_by_a_rename_is_read_anew_without_waiting_for_a_sweep(
    tmp_path: Path,
) -> None:
    """Appends are read through the open handle alone; a rename over the path must
    make the daemon look at the path again, at once, not at the next sweep (30 s)."""
    log = tmp_path / "logs" / "exp" / "metrics.jsonl"
    write_points(log, range(3))
    with following(tmp_path / "logs", tmp_path / "state") as (daemon, got):
        read_until(daemon, got, 3)
        write_points(log, range(3, 5))
        read_until(daemon, got, 5)
        assert [p.step for p in got] == [0, 1, 2, 3, 4]
        fresh = log.with_name("metrics.jsonl.new")
        write_points(fresh, range(100, 102))
        os.replace(fresh, log)
        read_until(daemon, got, 7)
        assert [p.step for p in got[5:]] == [100, 101]
        write_points(log, range(102, 103))
        read_until(daemon, got, 8)
        assert [p.step for p in got[7:]] == [102]
        assert daemon.sweep_interval() == runtime.SAFETY_SWEEP_SECONDS
