"""Read offsets are committed every COMMIT_SECONDS, not per cycle, yet never lag a snapshot."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

import pytest
from support.in_process import following, into, read_until, write_points

from trainsentry.point import Point, Row
from trainsentry.runtime import loop as runtime
from trainsentry.runtime.loop import Daemon
from trainsentry.state.db import StateDB


def committed(state_dir: Path, log: Path) -> int:
    db = StateDB(state_dir / "state.db")
    try:
        cp = db.load_offsets().get(str(log))
    finally:
        db.close()
    return cp.offset if cp is not None else -1


class Remembers:
    """The smallest alert state (runtime.Memory): the points it was handed."""

    digest = "test"

    def __init__(self) -> None:
        self.points: list[Point] = []

    def restore(self, blob: bytes) -> bool:
        return False

    def dump(self, out: BinaryIO) -> None:
        out.write(b"x")

    def relearn(self, run: str, rows: list[Row]) -> None:
        pass

    def keep_only(self, runs: set[str]) -> None:
        pass


def test_offsets_wait_for_the_commit_interval_and_a_stop_commits_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runtime, "COMMIT_SECONDS", 3600.0)
    log = tmp_path / "logs" / "exp" / "metrics.jsonl"
    write_points(log, range(5))
    with following(tmp_path / "logs", tmp_path / "state") as (daemon, got):
        read_until(daemon, got, 5)
        first = log.stat().st_size
        assert committed(tmp_path / "state", log) == first  # the first read commits at once
        write_points(log, range(5, 9))
        read_until(daemon, got, 9)
        assert len(got) == 9
        assert committed(tmp_path / "state", log) == first  # delivered, not committed yet
    assert committed(tmp_path / "state", log) == log.stat().st_size  # the stop commits


def test_a_snapshot_commits_the_offsets_it_is_taken_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart relearns from the snapshot's position up to the committed offset: the
    committed one must never be behind it."""
    monkeypatch.setattr(runtime, "COMMIT_SECONDS", 3600.0)
    log = tmp_path / "logs" / "exp" / "metrics.jsonl"
    write_points(log, range(5))
    with following(tmp_path / "logs", tmp_path / "state", Remembers()) as (daemon, got):
        write_points(log, range(5, 9))
        read_until(daemon, got, 9)
        daemon.restart.make_due()  # taken at the end of the next cycle
        daemon.cycle(timeout=0.1)
        snapshot = daemon.restart.file.load("test")
        assert snapshot is not None
        assert snapshot.offsets[str(log)].offset == log.stat().st_size
        assert committed(tmp_path / "state", log) == log.stat().st_size


def test_a_cycle_that_showed_alerts_commits_at_its_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alert lines on the terminal and in --alerts-jsonl repeat after a kill -9 only for
    the cycle it interrupted: the service asks for a commit when it showed transitions."""
    monkeypatch.setattr(runtime, "COMMIT_SECONDS", 3600.0)
    log = tmp_path / "logs" / "exp" / "metrics.jsonl"
    write_points(log, range(5))
    got: list[Point] = []
    daemon = Daemon([tmp_path / "logs"], StateDB(tmp_path / "state" / "state.db"), [into(got)])
    daemon.start()
    try:
        first = log.stat().st_size
        write_points(log, range(5, 9))
        read_until(daemon, got, 9)
        assert committed(tmp_path / "state", log) == first  # plain points wait for the interval
        write_points(log, range(9, 12))

        def shown(run: str, rows: list[Row]) -> None:  # as Service._deliver on transitions
            daemon.commit_soon()

        daemon.sinks.append(shown)
        read_until(daemon, got, 12)
        assert committed(tmp_path / "state", log) == log.stat().st_size
    finally:
        daemon.close()


def test_a_deleted_run_leaves_the_next_snapshot_without_its_files(tmp_path: Path) -> None:
    """The snapshot is taken at the end of the cycle that released them (the share of the
    loop allowing), not at the interval: after a restart, a file made again at the same
    path must not be relearned from a position of the file that was deleted."""
    kept = tmp_path / "logs" / "kept" / "metrics.jsonl"
    gone = tmp_path / "logs" / "gone" / "metrics.jsonl"
    write_points(kept, range(3))
    write_points(gone, range(3))
    with following(tmp_path / "logs", tmp_path / "state", Remembers()) as (daemon, got):
        read_until(daemon, got, 6)
        daemon.restart.make_due()
        daemon.cycle(timeout=0.1)
        saved = daemon.restart.file.load("test")
        assert saved is not None and set(saved.offsets) == {str(kept), str(gone)}
        gone.unlink()
        gone.parent.rmdir()
        for _ in range(20):
            daemon.cycle(timeout=0.1)
            saved = daemon.restart.file.load("test")
            assert saved is not None
            if str(gone) not in saved.offsets:
                break
        assert set(saved.offsets) == {str(kept)}
