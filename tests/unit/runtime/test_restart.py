"""What a restart keeps: the alert-state snapshot file beside state.db (written whole or
not at all, read back only by the code that wrote it, never fatal when it cannot be read)
and the position each followed file is relearned from."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import BinaryIO

import pytest

from trainsentry.point import Row
from trainsentry.runtime.restart import (
    SNAPSHOT_FILE,
    Restart,
    SnapshotFile,
    UnreadableState,
    relearn_start,
)
from trainsentry.state.db import Checkpoint


def positions() -> list[Checkpoint]:
    return [Checkpoint("/logs/a/metrics.jsonl", 1, 2, b"head", 120, b"behind", {"counter": 3})]


def body(out: BinaryIO) -> None:
    out.write(b"the state")


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_snapshot_comes_back_with_its_positions_for_the_code_that_wrote_it(
    tmp_path: Path, where: str
) -> None:
    file = SnapshotFile(tmp_path if where == "file" else None)
    assert file.load("v1") is None  # none yet
    assert file.save("v1", body, positions()) > len(b"the state")
    saved = file.load("v1")
    assert saved is not None and saved.blob == b"the state"
    assert saved.offsets == {p.path: p for p in positions()}
    assert file.load("v2") is None  # other code: relearned instead


def test_a_failed_save_keeps_the_last_snapshot_and_leaves_nothing_beside_it(
    tmp_path: Path,
) -> None:
    file = SnapshotFile(tmp_path)
    file.save("v1", body, positions())

    def fails(out: BinaryIO) -> None:
        out.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        file.save("v1", fails, [])
    saved = file.load("v1")
    assert saved is not None and saved.blob == b"the state"
    assert sorted(p.name for p in tmp_path.iterdir() if "snapshot" in p.name) == [SNAPSHOT_FILE]


def test_a_damaged_or_unreadable_snapshot_reads_as_none_and_a_damaged_one_is_kept_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = SnapshotFile(tmp_path)
    (tmp_path / SNAPSHOT_FILE).write_bytes(b"\x80\x05garbage")
    with caplog.at_level(logging.WARNING, logger="trainsentry.runtime.restart"):
        assert file.load("v1") is None
    kept = [p for p in tmp_path.iterdir() if p.name != SNAPSHOT_FILE]  # moved aside, kept
    assert [p.read_bytes() for p in kept] == [b"\x80\x05garbage"]
    assert f"moved aside to {kept[0]}" in caplog.text
    assert not (tmp_path / SNAPSHOT_FILE).exists()
    (tmp_path / SNAPSHOT_FILE).mkdir()  # cannot be opened as a file (root reads any mode)
    with caplog.at_level(logging.WARNING, logger="trainsentry.runtime.restart"):
        assert file.load("v1") is None
    assert "cannot read the saved alert state" in caplog.text


def at(offset: int, ino: int = 2, head: bytes = b"head") -> Checkpoint:
    return Checkpoint("/logs/a/metrics.jsonl", 1, ino, head, offset)


def test_a_file_relearns_from_its_snapshot_position_up_to_what_was_committed() -> None:
    assert relearn_start(at(100), at(250)) == at(100)
    assert relearn_start(at(250), at(250)) is None  # the snapshot saw all of it


def test_a_file_the_snapshot_never_saw_relearns_from_its_start() -> None:
    for saved in (None, at(100, ino=3), at(100, head=b"else"), at(300)):
        start = relearn_start(saved, at(250))  # absent, another file, or past the commit
        assert start is not None and start.offset == 0


def test_a_file_with_nothing_committed_is_read_as_new() -> None:
    assert relearn_start(at(100), None) is None
    assert relearn_start(at(100), at(0)) is None


class Unreadable:
    """A memory whose saved bytes cannot be read back, as a snapshot with a garbled body."""

    digest = "v1"

    def restore(self, blob: bytes) -> bool:
        raise UnreadableState("its alert state cannot be read back: EOFError: Ran out of input")

    def dump(self, out: BinaryIO) -> None:
        out.write(b"the state")

    def relearn(self, run: str, rows: list[Row]) -> None: ...

    def keep_only(self, runs: set[str]) -> None: ...


def test_a_snapshot_whose_body_cannot_be_read_back_is_kept_aside_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    file = SnapshotFile(tmp_path)
    file.save("v1", body, positions())  # a whole header, a body its memory cannot take
    with caplog.at_level(logging.WARNING, logger="trainsentry.runtime.restart"):
        restart = Restart(Unreadable(), file)
    assert restart.positions() == {}  # nothing restored: everything relearned
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{SNAPSHOT_FILE}.damaged-")]
    assert len(kept) == 1 and not (tmp_path / SNAPSHOT_FILE).exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / SNAPSHOT_FILE} is damaged (its alert state cannot be read back: EOFError: "
        f"Ran out of input); moved aside to {kept[0]}. Lost with it: the alert state (rule "
        "windows, pending and firing alerts, who was told); it is relearned from the logs, "
        "read again from their start, so an alert that fired before may be told again."
    ]
