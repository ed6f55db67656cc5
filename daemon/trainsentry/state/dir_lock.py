"""One daemon per state dir: an OS lock on a file in it, held for the daemon's life.

Two daemons on one state dir would take each other's offsets, post each alert
twice and race on the incident files; so the second refuses to start. The lock
is `flock` on `daemon.lock`, not the file's existence: the kernel releases it
when the holder dies however it dies (`kill -9`, OOM), so a lock left by a dead
daemon is taken over with no stale-file cleanup, and no pid is ever guessed
alive or dead. The holder's pid, host and start are written in the file only to
name it in the refusal.

The file is never deleted: a daemon deleting it while another opens it would
leave two daemons each holding a lock on a different inode.

The fd is opened close-on-exec (Python's default), so a command action or a
plot child never keeps the lock after the daemon is gone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

LOCK_FILE = "daemon.lock"
# `trainsentry run`'s exit status when another daemon holds the state dir
# (docs/commands.md); the systemd unit does not restart on it.
IN_USE_EXIT_STATUS = 75
# Errors of a filesystem that has no flock (Lustre mounted `noflock`, some FUSE ones).
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})


class StateDirInUse(Exception):
    """Another live daemon holds the state dir."""

    status = IN_USE_EXIT_STATUS


class LockError(Exception):
    """The lock file cannot be opened (a state dir not writable)."""


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds, or last held, the lock, as written in the file."""

    pid: str
    host: str
    since: str

    def said(self) -> str:
        return f"PID {self.pid} on {self.host} since {self.since}"


def holder_of(text: str) -> Holder | None:
    """The holder a lock file names; None for an empty or foreign file."""
    fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if "pid" not in fields:
        return None
    return Holder(fields["pid"], fields.get("host", "?"), fields.get("since", "?"))


class DirLock:
    """The state dir's lock, taken for this process (`take`) until `release` or its end."""

    def __init__(self, fd: int, path: Path, left: Holder | None, unsupported: str | None):
        self._fd: int | None = fd
        self.path = path
        # who held it before and ended without a clean stop (its record was still there)
        self.left = left
        # why the filesystem gave no lock (then nothing keeps a second daemon out)
        self.unsupported = unsupported

    @classmethod
    def take(cls, directory: Path) -> DirLock:
        """The lock, or StateDirInUse naming its holder; LockError if the file cannot be
        opened."""
        path = directory / LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LockError(f"cannot open {path}: {exc.strerror or exc}") from None
        unsupported = None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                holder = _holder_in(fd, wait=True)
                os.close(fd)
                who = holder.said() if holder else "another process"
                raise StateDirInUse(
                    f"state dir {directory} is in use by {who}; stop that daemon first, "
                    "or give this one a state dir of its own (--state-dir, state_dir)"
                ) from None
            if exc.errno not in _NO_LOCKS:
                os.close(fd)
                raise LockError(f"cannot lock {path}: {exc.strerror or exc}") from None
            unsupported = exc.strerror or str(exc)
        left = _holder_in(fd)
        _write(fd, Holder(str(os.getpid()), socket.gethostname(), _now()))
        return cls(fd, path, left, unsupported)

    def release(self) -> None:
        """At a clean stop: the record emptied (so the next start knows this one ended
        cleanly), then the lock let go."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None


def _holder_in(fd: int, *, wait: bool = False) -> Holder | None:
    """The record in the file. A holder writes it right after locking, so a refused
    reader may come between the two: it looks again briefly before naming no one."""
    for _ in range(20 if wait else 1):
        text = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        if text:
            return holder_of(text)
        time.sleep(0.01)
    return None


def _write(fd: int, holder: Holder) -> None:
    """Written over the old record, then cut to its length: a reader never sees it empty."""
    data = f"pid={holder.pid}\nhost={holder.host}\nsince={holder.since}\n".encode()
    with contextlib.suppress(OSError):  # a full disk: the lock holds, the record is older
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime())
