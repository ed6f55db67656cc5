"""A state file the daemon cannot read is moved aside and said, never dropped in silence.

A damaged `state.db` (random bytes, an emptied file, SQLite's "malformed") or a
garbage `alert-state.snapshot` is renamed beside itself with the time
(`state.db.damaged-20261204T185236Z`), kept for whoever wants to look, and the
daemon starts without it after one WARNING that says what was lost with it and
that alerts may repeat. Starting fresh in silence would re-post every alert
already delivered with no one knowing why; exiting on it would have systemd
restart into the same file every few seconds for ever.

What no move can fix (a `state.db` that is not a regular file, a state dir the
rename is refused in) stops the daemon with UNUSABLE_EXIT_STATUS and the one
command that recovers; the systemd unit does not restart on that status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sqlite3
import stat
import time
from pathlib import Path

log = logging.getLogger(__name__)

# `trainsentry run`'s exit status when the state dir holds a file it cannot use or move
# aside (docs/commands.md); the systemd unit does not restart on it.
UNUSABLE_EXIT_STATUS = 74
# SQLite's files beside a database: moved with it, so the kept copy opens as it was,
# and a new state.db never picks up the old one's write-ahead log.
COMPANIONS = ("-wal", "-shm", "-journal")
# SQLITE_CORRUPT, SQLITE_NOTADB: the file's bytes, not the moment (busy, locked, I/O).
_DAMAGED_CODES = frozenset({11, 26})
SQLITE_MAGIC = b"SQLite format 3\x00"
TABLES = frozenset({"offsets", "outbox", "deliveries"})


class StateUnusable(Exception):
    """A state file that can neither be used nor moved aside; says the command that recovers."""

    status = UNUSABLE_EXIT_STATUS


def aside_path(path: Path, when: float | None = None) -> Path:
    """Where a damaged file is kept: its name, `.damaged-` and the UTC time (a number
    added if two are set aside in one second)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
    target = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while target.exists() or target.is_symlink():
        n += 1
        target = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    return target


def set_aside(path: Path, when: float | None = None) -> Path:
    """Rename `path` (and its SQLite companions) aside; where it went. OSError if refused."""
    target = aside_path(path, when)
    os.rename(path, target)
    for suffix in COMPANIONS:
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{target}{suffix}")
    return target


def recovery_command(path: Path) -> str:
    """The one shell command that moves `path` and its companions out of the way."""
    target = aside_path(path)
    moves = [(path, target)] + [
        (Path(f"{path}{s}"), Path(f"{target}{s}"))
        for s in COMPANIONS
        if os.path.lexists(f"{path}{s}")
    ]
    return " && ".join(f"mv {shlex.quote(str(a))} {shlex.quote(str(b))}" for a, b in moves)


def db_damage(path: Path) -> str | None:
    """What is wrong with the state database at `path`; None when it is usable or absent.

    A `PRAGMA quick_check` at start finds a malformed page before the loop trips on
    it; it is cheap (measured: 0.13 s for a 106 MB state.db of 10,000 offsets and
    50,000 outbox rows).
    A file that is not a regular file raises StateUnusable: it is not ours to move.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(mode):
        raise StateUnusable(
            f"{path} is not a regular file, so the state cannot be kept there; "
            f"recover with `{recovery_command(path)}` and start trainsentry again"
        )
    with open(path, "rb") as f:
        head = f.read(len(SQLITE_MAGIC))
    if head and head != SQLITE_MAGIC[: len(head)]:
        return "file is not a database"  # said before SQLite opens it and tidies its WAL away
    db = None
    try:
        db = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None, timeout=30)
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        checked = [str(r[0]) for r in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as exc:
        code = getattr(exc, "sqlite_errorcode", None)
        if code is None or code & 0xFF not in _DAMAGED_CODES:
            raise
        return str(exc)
    finally:
        if db is not None:
            db.close()
    if checked != ["ok"]:
        return "; ".join(checked)
    if not tables:
        return "it holds no tables: an emptied file"
    if not tables & TABLES:
        return f"it holds none of trainsentry's tables ({', '.join(sorted(tables))})"
    return None


def set_aside_if_damaged(path: Path) -> Path | None:
    """Look at state.db before it is opened: a damaged one moved aside and said; where
    it went. StateUnusable where it can neither be used nor moved."""
    reason = db_damage(path)
    if reason is None:
        return None
    try:
        kept = set_aside(path)
    except OSError as exc:
        raise StateUnusable(
            f"{path} is damaged ({reason}) and cannot be moved aside: "
            f"{exc.strerror or exc}; recover with `{recovery_command(path)}` "
            "(as a user who may write there) and start trainsentry again"
        ) from None
    log.warning(
        "%s is damaged (%s); moved aside to %s. Lost with it: the read offsets, the "
        "notifications not yet sent and the sent log. Logs are read again from the "
        "alert-state snapshot's positions, or from their start without one, so alerts "
        "already delivered may be sent again.",
        path,
        reason,
        kept,
    )
    return kept
