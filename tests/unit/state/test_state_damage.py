"""What counts as a damaged state.db, where it is kept, and what cannot be moved."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from trainsentry.state.damage import (
    StateUnusable,
    aside_path,
    db_damage,
    set_aside,
    set_aside_if_damaged,
)
from trainsentry.state.db import StateDB


def whole_db(path: Path) -> Path:
    StateDB(path).close()
    return path


def test_a_missing_or_whole_state_db_is_no_damage(tmp_path: Path) -> None:
    assert db_damage(tmp_path / "state.db") is None
    assert db_damage(whole_db(tmp_path / "state.db")) is None


def test_random_bytes_an_emptied_file_and_another_programs_database_are_damage(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(os.urandom(8192))
    assert db_damage(path) == "file is not a database"
    path.write_bytes(b"")
    assert db_damage(path) == "it holds no tables: an emptied file"
    path.unlink()
    import sqlite3

    with sqlite3.connect(path) as other:
        other.execute("CREATE TABLE songs (title TEXT)")
    assert db_damage(path) == "it holds none of trainsentry's tables (songs)"


def test_a_malformed_page_is_found_at_start(tmp_path: Path) -> None:
    path = whole_db(tmp_path / "state.db")
    data = bytearray(path.read_bytes())
    data[100:] = b"\xa5" * (len(data) - 100)  # the header kept, the pages after it gone
    path.write_bytes(bytes(data))
    assert db_damage(path) == "database disk image is malformed"


def test_a_damaged_file_is_kept_with_the_time_and_its_companions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"junk")
    Path(f"{path}-wal").write_bytes(b"wal")
    with caplog.at_level(logging.WARNING, logger="trainsentry.state.damage"):
        kept = set_aside_if_damaged(path)
    assert kept is not None and not path.exists() and not Path(f"{path}-wal").exists()
    assert re.fullmatch(r"state\.db\.damaged-\d{8}T\d{6}Z", kept.name)
    assert kept.read_bytes() == b"junk" and Path(f"{kept}-wal").read_bytes() == b"wal"
    assert f"is damaged (file is not a database); moved aside to {kept}." in caplog.text
    assert "alerts already delivered may be sent again" in caplog.text


def test_two_set_aside_in_one_second_keep_both(tmp_path: Path) -> None:
    path = tmp_path / "alert-state.snapshot"
    path.write_bytes(b"one")
    first = set_aside(path, when=1_800_000_000)
    path.write_bytes(b"two")
    second = set_aside(path, when=1_800_000_000)
    assert first != second and first.read_bytes() == b"one" and second.read_bytes() == b"two"
    assert aside_path(path, 1_800_000_000).name.endswith("-3")


def test_a_state_db_that_is_no_file_is_not_moved_but_the_command_is_said(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    path.mkdir()
    with pytest.raises(StateUnusable, match=r"recover with `mv .*state\.db .*state\.db\.damaged-"):
        set_aside_if_damaged(path)
    assert path.is_dir()
