"""Linux inotify, read by the daemon's own loop.

Written here rather than taken from watchdog because of the hot path: a
fleet's logs raise about one IN_MODIFY per run per second, and watchdog's
inotify observer spent a third of the daemon's CPU on them (an emitter and a
dispatcher thread, a move-pairing delay queue, an event object per kernel
event, and the GIL handed back and forth between those threads and the loop
that reads the files). The loop needs only *which paths changed*: one
read() returns every queued event, struct parses them, and the thread that
reads the files waits on the descriptor itself. watchdog stays for the
platforms without inotify (watchdog_backend.py).

Watches are added per directory (inotify is not recursive): the tree at
`add_tree`, and each directory created or moved in when its event is read,
before the daemon lists it, so nothing written into it is missed. Like the
daemon's sweep, the walk leaves out .git and the daemon's control directory
and does not follow symlinks, so watches and walked directories can be
compared to detect the kernel's watch limit (kernel.py).
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
import time
from pathlib import Path

from trainsentry.sources.discover import CONTROL_DIR
from trainsentry.watching.libc import LIBC
from trainsentry.watching.watcher import Changes, Watcher

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

# No open or close-without-write events: the daemon's own reads would wake it.
# IN_ATTRIB: a chmod that makes a file or directory readable again.
MASK = IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
SKIPPED_DIRS = frozenset({CONTROL_DIR, ".git"})
_HEADER = struct.Struct("iIII")  # wd, mask, cookie, len (struct inotify_event)
_READ_BYTES = 1 << 16
# events that are not a plain change of a file in a watched directory
_NOT_A_FILE_CHANGE = IN_ISDIR | IN_IGNORED | IN_Q_OVERFLOW
# events after which the path may name another file than before (Changes.relinked)
_RELINKS = IN_CREATE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE | IN_ATTRIB
_NAMED_MAX = 1 << 16


def available() -> bool:
    return hasattr(LIBC, "inotify_init1")


def _lib() -> ctypes.CDLL:
    assert LIBC is not None  # InotifyTree is made only where available()
    return LIBC


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")
    return result


class InotifyTree:
    """One inotify descriptor watching whole directory trees."""

    def __init__(self) -> None:
        self.fd = _check(_lib().inotify_init1(IN_NONBLOCK | IN_CLOEXEC), "inotify_init1")
        self._paths: dict[int, str] = {}  # watch descriptor -> the directory (or file) it watches
        self._tops: set[str] = set()  # what add_tree was asked to watch
        # (wd, name as the kernel gave it) -> the file's path: a live fleet writes the
        # same files over and over, and joining and decoding the path of each event
        # was most of this module's cost. Cleared whenever a directory event could
        # move a watch to another path.
        self._named: dict[tuple[int, bytes], str] = {}
        self._lost: set[str] = set()  # tops whose watch the kernel removed (deleted)

    # -- watches ------------------------------------------------------------

    def add_tree(self, top: str) -> None:
        """Watch `top` and every directory under it.

        OSError only for `top` itself (the kernel's watch limit, permissions);
        directories below that cannot be watched are left out without a word,
        as watchdog does: the daemon compares watches with the directories
        its sweep walked and polls a root that is short.
        """
        self._tops.add(top)
        if not os.path.isdir(top):
            self._add(top, MASK)  # a single watched file
            return
        self._add(top, MASK | IN_ONLYDIR)
        self._add_below(top)

    def _find_lost(self, into: Changes) -> None:
        """Watch again a top that was deleted (its watch went with it) and is back.

        A scratch directory wiped and made anew would otherwise be read only
        by the safety sweeps; the whole tree is reported, for the daemon to list.
        """
        for top in list(self._lost):
            if not os.path.exists(top):
                continue
            try:
                self.add_tree(top)
            except OSError:
                continue
            self._lost.discard(top)
            into.dirs.add(top)

    def _add_below(self, top: str) -> None:
        pending = [top]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    subdirs = [
                        e.path
                        for e in entries
                        if e.name not in SKIPPED_DIRS and e.is_dir(follow_symlinks=False)
                    ]
            except OSError:
                continue  # unreadable or gone: the sweep reports it, a later add retries
            for sub in subdirs:
                try:
                    self._add(sub, MASK | IN_ONLYDIR | IN_DONT_FOLLOW)
                except OSError:
                    continue
                pending.append(sub)

    def _add(self, path: str, mask: int) -> None:
        wd = _check(_lib().inotify_add_watch(self.fd, os.fsencode(path), mask), path)
        if self._paths.get(wd, path) != path:
            self._named.clear()  # the same inode again (a move): same wd, new path
        self._paths[wd] = path

    def _forget_below(self, path: str) -> None:
        """A directory moved away: its watches would report paths it no longer has."""
        prefix = path + os.sep
        for wd, watched in list(self._paths.items()):
            if watched == path or watched.startswith(prefix):
                _lib().inotify_rm_watch(self.fd, wd)
                del self._paths[wd]

    @property
    def watches(self) -> int:
        return len(self._paths)

    # -- events -------------------------------------------------------------

    def wait(self, timeout: float) -> bool:
        """True when events are ready to read, False after `timeout` seconds."""
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout)
        except InterruptedError:
            return False
        return bool(ready)

    def read(self, into: Changes) -> Changes:
        """Every queued event, as paths: directories created or moved in are watched here."""
        while True:
            try:
                data = os.read(self.fd, _READ_BYTES)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            if not data:
                break
            self._parse(data, into)  # the kernel returns whole events only
        if self._lost:
            self._find_lost(into)
        return into

    def _parse(self, data: bytes, into: Changes) -> None:
        unpack, size, paths = _HEADER.unpack_from, _HEADER.size, self._paths
        files, dirs, relinked = into.files, into.dirs, into.relinked
        offset, end = 0, len(data)
        named = self._named
        while offset + size <= end:
            wd, mask, _cookie, length = unpack(data, offset)
            raw = data[offset + size : offset + size + length]
            offset += size + length
            if not mask & _NOT_A_FILE_CHANGE:
                path = named.get((wd, raw))
                if path is not None:  # a file seen before in a watched directory
                    files.add(path)
                    if mask & _RELINKS:
                        relinked.add(path)
                    continue
            name = raw.rstrip(b"\0")
            if mask & IN_Q_OVERFLOW:
                into.overflow = True
                continue
            base = paths.get(wd)
            if mask & IN_IGNORED:
                named.clear()
                gone = paths.pop(wd, "")  # removed by the kernel or by us
                if gone in self._tops:
                    self._lost.add(gone)
                continue
            if base is None:
                continue  # an event queued before its watch was removed
            path = os.path.join(base, os.fsdecode(name)) if name else base
            if not mask & IN_ISDIR:
                files.add(path)
                if mask & _RELINKS:
                    relinked.add(path)
                if name and not mask & _NOT_A_FILE_CHANGE:
                    if len(named) >= _NAMED_MAX:
                        named.clear()
                    named[(wd, raw)] = path
                continue
            named.clear()  # a directory created, moved or gone: watches may have moved
            dirs.add(path)
            if mask & (IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE):
                relinked.add(path)  # the files below it moved with it
            if os.path.basename(path) in SKIPPED_DIRS:
                continue
            if mask & IN_MOVED_FROM:
                self._forget_below(path)
            elif mask & (IN_CREATE | IN_MOVED_TO) or (
                # a directory made readable again gets the watches it was refused
                # (a chmod of a directory is rare: a look through the watches is fine)
                mask & IN_ATTRIB and name and path not in paths.values()
            ):
                try:
                    self._add(path, MASK | IN_ONLYDIR | IN_DONT_FOLLOW)
                except OSError:
                    continue
                self._add_below(path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
            self._paths.clear()
            self._named.clear()
            self._lost.clear()


class InotifyWatcher(Watcher):
    """inotify read on the calling thread: no thread of its own (see inotify.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._tree: InotifyTree | None = None
        self._held = Changes()  # read by catch_up, handed out by the next take

    def _start(self) -> None:
        self._tree = InotifyTree()

    def _add(self, root: Path) -> None:
        assert self._tree is not None
        self._tree.add_tree(str(root))

    def wait(self, timeout: float) -> bool:
        if self._tree is None:
            time.sleep(timeout)
            return False
        return self._tree.wait(timeout)

    def take(self) -> Changes:
        changes, self._held = self._held, Changes()
        return changes if self._tree is None else self._tree.read(changes)

    def catch_up(self) -> None:
        """New directories are watched when their events are read, on this thread."""
        if self._tree is not None:
            self._tree.read(self._held)

    def stop(self) -> None:
        if self._tree is not None:
            self._tree.close()
            self._tree = None
