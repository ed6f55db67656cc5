"""The state dir's lock in one process: flock conflicts between two open files even there,
so a second take is refused naming the holder, and a holder that let go without a clean
stop is named to the next."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from trainsentry.state.dir_lock import LOCK_FILE, DirLock, StateDirInUse, holder_of


def test_a_second_take_is_refused_naming_the_holder(tmp_path: Path) -> None:
    first = DirLock.take(tmp_path)
    try:
        with pytest.raises(StateDirInUse) as refused:
            DirLock.take(tmp_path)
        said = str(refused.value)
        assert said.startswith(
            f"state dir {tmp_path} is in use by PID {os.getpid()} on {socket.gethostname()} since "
        ), said
        assert refused.value.status == 75
    finally:
        first.release()
    again = DirLock.take(tmp_path)  # let go: free again, and a clean stop names no one
    assert again.left is None
    again.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""


def test_a_lock_let_go_without_a_clean_stop_is_taken_over_and_its_holder_named(
    tmp_path: Path,
) -> None:
    (tmp_path / LOCK_FILE).write_text("pid=4242\nhost=node7\nsince=2026-12-01T10:00:00+0000\n")
    lock = DirLock.take(tmp_path)  # no one holds the flock: the record is a dead one's
    try:
        assert lock.left is not None
        assert lock.left.said() == "PID 4242 on node7 since 2026-12-01T10:00:00+0000"
        assert f"pid={os.getpid()}\n" in (tmp_path / LOCK_FILE).read_text()
    finally:
        lock.release()


def test_a_lock_file_of_anything_else_names_no_holder() -> None:
    assert holder_of("") is None
    assert holder_of("\x00\xff garbage\n") is None
    assert holder_of("pid=7\n") is not None
