"""The alert-state snapshot file beside state.db: written whole or not at all, read back
only by the code that wrote it, and never fatal when it cannot be read."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import BinaryIO

import pytest

from trainsentry.state.db import SNAPSHOT_FILE, Checkpoint, StateDB


def positions() -> list[Checkpoint]:
    return [Checkpoint("/logs/a/metrics.jsonl", 1, 2, b"head", 120, b"behind", {"counter": 3})]


def body(out: BinaryIO) -> None:
    out.write(b"the state")


@pytest.mark.parametrize("where", ["file", "memory"])
def test_a_snapshot_comes_back_with_its_positions_for_the_code_that_wrote_it(
    tmp_path: Path, where: str
) -> None:
    state = StateDB(tmp_path / "state.db" if where == "file" else ":memory:")
    assert state.load_snapshot("v1") is None  # none yet
    assert state.save_snapshot("v1", body, positions()) > len(b"the state")
    saved = state.load_snapshot("v1")
    assert saved is not None and saved.blob == b"the state"
    assert saved.offsets == {p.path: p for p in positions()}
    assert state.load_snapshot("v2") is None  # other code: relearned instead
    state.close()


def test_a_failed_save_keeps_the_last_snapshot_and_leaves_nothing_beside_it(
    tmp_path: Path,
) -> None:
    state = StateDB(tmp_path / "state.db")
    state.save_snapshot("v1", body, positions())

    def fails(out: BinaryIO) -> None:
        out.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        state.save_snapshot("v1", fails, [])
    saved = state.load_snapshot("v1")
    assert saved is not None and saved.blob == b"the state"
    assert sorted(p.name for p in tmp_path.iterdir() if "snapshot" in p.name) == [SNAPSHOT_FILE]
    state.close()


def test_a_damaged_or_unreadable_snapshot_reads_as_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = StateDB(tmp_path / "state.db")
    (tmp_path / SNAPSHOT_FILE).write_bytes(b"\x80\x05garbage")
    assert state.load_snapshot("v1") is None
    (tmp_path / SNAPSHOT_FILE).unlink()
    (tmp_path / SNAPSHOT_FILE).mkdir()  # cannot be opened as a file (root reads any mode)
    with caplog.at_level(logging.WARNING, logger="trainsentry.state.db"):
        assert state.load_snapshot("v1") is None
    assert "cannot read the saved alert state" in caplog.text
    state.close()
