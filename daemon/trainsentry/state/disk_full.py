"""When the state dir cannot be written (disk full, quota, file-size limit), alerting goes on.

The state DB holds read offsets and the notification outbox. Neither has to be
on disk for an alert to be raised: the points are in memory, the rules run on
them, and a receiver can be sent a message from memory. So a write that fails
because the disk is full must not stop the daemon. What it cannot write is
held in memory and written in full once a later write succeeds. A restart
while writes fail goes back to the last offsets that were saved: points read
since then are read again, which at-least-once delivery already allows.

The operator hears about it once when writes start failing, again every ten
minutes while they keep failing (the journal of a daemon that runs for months
is not flooded), and once when they work again. Any other database error is a
bug or a corrupt file and is raised as before.
"""

from __future__ import annotations

import contextlib
import errno
import math
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

from trainsentry.state.db import Checkpoint, StateDB
from trainsentry.stop_signals import signals_deferred

REMIND_SECONDS = 600.0
# SQLITE_FULL, SQLITE_IOERR (a write the OS refused: EFBIG under RLIMIT_FSIZE),
# SQLITE_READONLY and SQLITE_CANTOPEN (a state dir remounted read-only).
UNWRITABLE_SQLITE = frozenset({13, 10, 8, 14})
UNWRITABLE_ERRNO = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})


def is_unwritable(exc: BaseException) -> bool:
    """True for the errors of a state dir that cannot take more bytes now."""
    if isinstance(exc, sqlite3.OperationalError):
        code = getattr(exc, "sqlite_errorcode", None)
        if code is not None:
            return code & 0xFF in UNWRITABLE_SQLITE
        return "full" in str(exc) or "disk I/O" in str(exc) or "readonly" in str(exc)
    return isinstance(exc, OSError) and exc.errno in UNWRITABLE_ERRNO


def rollback(db: sqlite3.Connection) -> None:
    """A failed COMMIT can leave its transaction open; the next BEGIN would then fail."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")


class WriteTrouble:
    """Says when state writes start failing, keep failing, and work again; thread-safe."""

    def __init__(
        self,
        path: Path,
        *,
        out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        remind: float = REMIND_SECONDS,
    ) -> None:
        self.path = path
        self._out = out
        self._clock = clock
        self._remind = remind
        self._lock = threading.Lock()
        self.failures = 0  # since writes last worked
        self._since: float | None = None
        self._next_reminder = 0.0
        # On a full disk a write can still fit now and then (SQLite reuses its WAL
        # after a checkpoint): failures soon after a recovery continue quietly
        # rather than repeating both lines every cycle.
        self._recovered_at = -math.inf
        self._quiet = False

    @property
    def failing(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException) -> None:
        now = self._clock()
        with self._lock:
            self.failures += 1
            if self._since is None:
                self._since = now
                self._next_reminder = now + self._remind
                self._quiet = now - self._recovered_at < self._remind
                if self._quiet:
                    return
                text = (
                    f"cannot write the state in {self.path}: {exc}; alerting goes on, "
                    "offsets and notifications are held in memory until it can be written "
                    "(a restart before then re-reads from the last saved offsets)"
                )
            elif now >= self._next_reminder:
                self._next_reminder = now + self._remind
                text = (
                    f"the state in {self.path} still cannot be written "
                    f"({self.failures} writes failed in {now - self._since:.0f} s): {exc}"
                )
            else:
                return
        self._say(text)

    def worked(self) -> None:
        if self._since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._since is None:
                return
            now = self._clock()
            took, failures = now - self._since, self.failures
            self._since, self.failures = None, 0
            if self._quiet:
                return
            self._recovered_at = now
        self._say(
            f"the state in {self.path} can be written again after {took:.0f} s "
            f"({failures} writes had failed); what was held in memory is saved"
        )

    def _say(self, text: str) -> None:
        out = self._out if self._out is not None else sys.stderr
        with signals_deferred():
            out.write(f"trainsentry: {text}\n")
            out.flush()


class HeldState(StateDB):
    """The state DB whose offset writes survive a full disk: unsaved offsets wait in memory.

    Offsets are saved per read cycle for the files that cycle touched; a
    cycle whose save failed would otherwise leave its files' offsets stale on
    disk forever. So every checkpoint not yet saved is kept (one per file,
    the newest) and goes with the next save that works.
    """

    def __init__(self, path: Path | str, trouble: WriteTrouble) -> None:
        super().__init__(path)
        self.trouble = trouble
        self._held: dict[str, Checkpoint] = {}
        self._forget: set[str] = set()

    @property
    def held(self) -> int:
        """Files whose newest offset is only in memory."""
        return len(self._held)

    def save_offsets(self, checkpoints: Iterable[Checkpoint]) -> None:
        held = {**self._held, **{c.path: c for c in checkpoints}}
        if not held and not self._forget:
            return
        try:
            if self._forget:
                super().forget_offsets(self._forget)
                self._forget = set()
            super().save_offsets(held.values())
        except (sqlite3.OperationalError, OSError) as exc:
            if not is_unwritable(exc):
                raise
            rollback(self._db)
            self._held = held
            self.trouble.failed(exc)
            return
        self._held = {}
        self.trouble.worked()

    def forget_offsets(self, paths: Iterable[str]) -> None:
        paths = list(paths)
        for p in paths:
            self._held.pop(p, None)
        try:
            super().forget_offsets(paths)
        except (sqlite3.OperationalError, OSError) as exc:
            if not is_unwritable(exc):
                raise
            rollback(self._db)
            self._forget.update(paths)
            self.trouble.failed(exc)
