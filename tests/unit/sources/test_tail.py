"""The tailer across the life of a log file: appends, partial writes, rotation, truncation."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from trainsentry.sources.discover import Root
from trainsentry.sources.tail import FileTail
from trainsentry.state.db import Checkpoint, StateDB


def line(step: int, loss: float) -> bytes:
    return (json.dumps({"step": step, "loss": loss}) + "\n").encode()


def tail_of(path: Path, checkpoint=None, relearn_from=None) -> FileTail:
    log = Root.watched(path.parent).describe(path)
    assert log is not None
    return FileTail(log, checkpoint, relearn_from=relearn_from)


def steps(tail: FileTail, same_file: bool = False) -> list[int]:
    got = tail.read(same_file=same_file)
    return [p.step for p in got.points]


# What a file that only changed in place reads as, whether the daemon stats its path
# first or reads through the handle alone (no directory event named the path).
through_the_handle = pytest.mark.parametrize("same_file", [False, True], ids=["stat", "handle"])


@through_the_handle
def test_appended_points_are_read_once(tmp_path: Path, same_file: bool) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9))
    tail = tail_of(path)
    assert steps(tail, same_file) == [0, 1]
    assert steps(tail, same_file) == []
    with path.open("ab") as f:
        f.write(line(2, 0.8))
    assert steps(tail, same_file) == [2]


@through_the_handle
def test_partial_line_is_read_once_complete(tmp_path: Path, same_file: bool) -> None:
    path = tmp_path / "metrics.jsonl"
    whole = line(5, 0.5)
    path.write_bytes(line(4, 0.6) + whole[:7])
    tail = tail_of(path)
    assert steps(tail, same_file) == [4]
    assert steps(tail, same_file) == []
    with path.open("ab") as f:
        f.write(whole[7:])
    assert steps(tail, same_file) == [5]


def test_points_carry_run_and_keras_split_prefix(tmp_path: Path) -> None:
    run = tmp_path / "exp1" / "validation"
    run.mkdir(parents=True)
    (run / "m.jsonl").write_bytes(line(0, 2.0))
    [log] = Root.watched(tmp_path).scan()
    got = FileTail(log).read()
    assert [(p.run, p.tag) for p in got.points] == [("exp1", "validation/loss")]


@through_the_handle
def test_copytruncate_starts_over_from_the_top(tmp_path: Path, same_file: bool) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9))
    tail = tail_of(path)
    assert steps(tail, same_file) == [0, 1]
    with path.open("r+b") as f:
        f.truncate(0)
    assert steps(tail, same_file) == []
    with path.open("ab") as f:
        f.write(line(2, 0.8))
    assert steps(tail, same_file) == [2]


@through_the_handle
def test_file_rewritten_in_place_with_other_content_is_read_again(
    tmp_path: Path, same_file: bool
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0))
    tail = tail_of(path)
    assert steps(tail, same_file) == [0]
    path.write_bytes(line(7, 3.0) + line(8, 2.0))  # same inode, longer, other bytes
    assert steps(tail, same_file) == [7, 8]


def test_rotation_drains_the_old_file_then_follows_the_new(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0))
    tail = tail_of(path)
    assert steps(tail) == [0]
    with path.open("ab") as f:
        f.write(line(1, 0.9))  # appended just before rotation
    os.rename(path, tmp_path / "metrics.jsonl.1")
    path.write_bytes(line(2, 0.8))
    assert steps(tail) == [1, 2]


def test_deleted_file_is_reported_gone(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0))
    tail = tail_of(path)
    assert steps(tail) == [0]
    path.unlink()
    assert tail.read().gone


def test_file_vanishing_before_first_read_is_gone_not_an_error(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0))
    tail = tail_of(path)
    path.unlink()
    got = tail.read()
    assert got.gone and not got.errors and not got.points


def test_checkpoint_resumes_without_rereading(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9))
    db = StateDB(tmp_path / "state.db")
    tail = tail_of(path)
    assert steps(tail) == [0, 1]
    db.save_offsets([tail.checkpoint()])
    tail.close()
    with path.open("ab") as f:
        f.write(line(2, 0.8))
    resumed = tail_of(path, StateDB(tmp_path / "state.db").load_offsets()[str(path)])
    assert steps(resumed) == [2]


def test_checkpoint_of_a_replaced_file_is_not_trusted(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9))
    tail = tail_of(path)
    steps(tail)
    checkpoint = tail.checkpoint()
    tail.close()
    path.unlink()
    path.write_bytes(line(10, 1.0) + line(11, 0.9) + line(12, 0.8))  # new inode, longer
    assert steps(tail_of(path, checkpoint)) == [10, 11, 12]


def test_budget_splits_a_large_backlog(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(line(i, 1.0) for i in range(50_000)))
    tail = tail_of(path)
    seen: list[int] = []
    for _ in range(100):
        got = tail.read(budget=64 << 10)
        seen.extend(p.step for p in got.points)
        if not got.more:
            break
    assert seen == list(range(50_000))


@through_the_handle
def test_line_longer_than_a_read_chunk_is_read_whole(tmp_path: Path, same_file: bool) -> None:
    path = tmp_path / "metrics.jsonl"
    big = {"step": 1, "loss": 0.5, "note": "x" * (10 << 20)}
    path.write_bytes(line(0, 1.0))
    tail = tail_of(path)
    assert steps(tail, same_file) == [0]
    with path.open("ab") as f:  # appended while followed: more than a read of an append
        f.write((json.dumps(big) + "\n").encode() + line(2, 0.3))
    assert steps(tail, same_file) == [1, 2]


def test_relearning_reads_again_from_an_earlier_position_then_delivers_the_rest(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9))
    first = tail_of(path)
    assert steps(first) == [0, 1]
    saved = first.checkpoint()  # where the alert state was saved
    with path.open("ab") as f:
        f.write(line(2, 0.8) + line(3, 0.7))
    assert steps(first) == [2, 3]
    committed = first.checkpoint()  # where delivery stood at the crash
    with path.open("ab") as f:
        f.write(line(4, 0.6))

    again = tail_of(path, committed, relearn_from=saved)
    assert again.relearning and again.checkpoint() == committed
    got = again.read()
    assert [p.step for p in got.replayed] == [2, 3]  # seen by nobody's state, told already
    assert got.points == [] and got.more  # new points wait for the next read
    assert not again.relearning and again.checkpoint() == committed
    assert steps(again) == [4]
    assert again.checkpoint().offset == path.stat().st_size


def test_relearning_from_the_start_keeps_the_committed_checkpoint_until_done(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9) + line(2, 0.8))
    first = tail_of(path)
    steps(first)
    committed = first.checkpoint()
    with path.open("ab") as f:
        f.write(line(3, 0.7))
    again = tail_of(path, committed, relearn_from=Checkpoint(str(path), 0, 0, b"", 0))
    assert again.checkpoint() == committed  # a crash before the read resumes delivery there
    assert again.position().offset == 0  # while the state has seen nothing of the file
    got = again.read()
    assert [p.step for p in got.replayed] == [0, 1, 2]
    assert steps(again) == [3]


def test_a_file_rewritten_since_its_checkpoint_relearns_nothing_and_delivers_anew(
    tmp_path: Path,
) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(line(0, 1.0) + line(1, 0.9))
    tail = tail_of(path)
    steps(tail)
    committed = tail.checkpoint()
    with path.open("r+b") as f:  # rewritten in place: same inode, other content
        f.write(line(7, 5.0))
    again = tail_of(path, committed, relearn_from=Checkpoint(str(path), 0, 0, b"", 0))
    got = again.read()
    assert got.replayed == []  # none of it was told before: nothing passes as relearned
    assert 7 in [p.step for p in got.points]
    assert not again.relearning


def test_an_append_read_through_the_handle_needs_no_stat_and_is_stamped_when_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines without a time get the file's mtime, or (read live) the time they were read."""
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b"".join(line(i, 1.0) for i in range(3)))  # a head to fingerprint
    os.utime(path, (1_000_000.0, 1_000_000.0))
    tail = tail_of(path)
    assert [p.wall_time for p in tail.read().points] == [1_000_000.0] * 3
    with path.open("ab") as f:
        f.write(line(3, 0.9))
    os.utime(path, (1_000_000.0, 1_000_000.0))

    def no_stat(*args: object, **kwargs: object) -> os.stat_result:
        raise AssertionError("the path was looked up")

    before = time.time()
    with monkeypatch.context() as patched:
        patched.setattr(os, "stat", no_stat)
        patched.setattr(os, "fstat", no_stat)
        got = tail.read(same_file=True).points
    assert [p.step for p in got] == [3] and before <= got[0].wall_time <= time.time()
