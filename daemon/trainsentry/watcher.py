"""Tells the daemon which files may have changed, so it reads only those.

inotify where the kernel sees the writes (read on the daemon's own loop,
inotify.py; watchdog on platforms without it, watcher_watchdog.py); polling
where it cannot: on network filesystems a write from another host raises no
event on this one, so roots on nfs/lustre/gpfs/cifs/fuse/9p are swept on a
timer instead. Open and close-without-write events are never asked for: with
them watchdog 7.1 overflowed the kernel queue on trees of thousands of
directories, and the daemon's own reads would wake it up.

The kernel's watch limit (fs.inotify.max_user_watches, shared by every
process of the user) is the other trap: a recursive watch fails loudly only
for the root and leaves sub-directories it could not add unwatched. So the
watches are counted from the kernel (/proc/self/fdinfo) and compared with the
directories a sweep walked; a root short of watches is polled instead, with
one warning that says how to raise the limit.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from pathlib import Path

from trainsentry import inotify
from trainsentry.inotify import Changes

log = logging.getLogger(__name__)

NETWORK_FS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs",
     "beegfs", "panfs", "afs", "wekafs", "virtiofs"}
)  # fmt: skip

WATCH_LIMIT_FILE = Path("/proc/sys/fs/inotify/max_user_watches")


def inotify_watches(proc: Path = Path("/proc/self")) -> int | None:
    """inotify watches this process holds, from the kernel; None where /proc cannot tell.

    watchdog does not say how many watches it holds; the kernel does, as one
    `inotify wd:` line per watch in the fdinfo of each inotify descriptor.
    """
    try:
        fds = os.listdir(proc / "fd")
    except OSError:
        return None
    total = 0
    for fd in fds:
        try:
            if os.readlink(proc / "fd" / fd) != "anon_inode:inotify":
                continue
            with open(proc / "fdinfo" / fd, encoding="ascii", errors="replace") as f:
                total += sum(1 for line in f if line.startswith("inotify wd:"))
        except OSError:  # closed between listing and reading
            continue
    return total


def inotify_watch_limit(path: Path = WATCH_LIMIT_FILE) -> int | None:
    """The per-user limit (shared with every process of the same user)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def watch_shortfall(directories: int, watches: int | None) -> int:
    """Directories left without a watch: 0 when the count is unknown or enough.

    One watch per directory is what a recursive watch needs; more watches than
    directories is normal (the daemon skips .git and its own control
    directories, watchdog does not), so only a shortfall means a deaf subtree.
    """
    if watches is None or watches >= directories:
        return 0
    return directories - watches


def limit_advice(limit: int | None, directories: int | None = None) -> str:
    """The sysctl line that would make room, with headroom for growth and other processes."""
    current = limit or 8192
    wanted = max(2 * current, current + 2 * (directories or 0), 524288)
    return (
        f"raise it with `sysctl fs.inotify.max_user_watches={wanted}` "
        "(persist it in /etc/sysctl.d/) and restart trainsentry"
    )


def filesystem_type(path: Path, mounts: str = "/proc/mounts") -> str:
    """The type of the filesystem `path` lives on, from the longest mount prefix."""
    target = os.path.realpath(path)
    best, fstype = "", "unknown"
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                point = parts[1].replace("\\040", " ")
                inside = target == point or target.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, fstype = point, parts[2]
    except OSError:
        pass
    return fstype


def needs_polling(path: Path) -> bool:
    fstype = filesystem_type(path)
    return fstype in NETWORK_FS or fstype.startswith("fuse")


class Watcher:
    """Changed paths for the daemon's loop; roots it cannot watch natively are swept."""

    def __init__(self) -> None:
        self.native: list[Path] = []

    def watch(self, roots: list[Path]) -> None:
        """Watch each root natively where inotify works; the rest is left to sweeps.

        Each root is added alone, so one that cannot be watched (watch limit,
        permissions) falls back to polling without taking the others along.
        """
        self._start()
        for root in roots:
            if needs_polling(root):
                log.info("%s is on a network filesystem: polling it", root)
                continue
            try:
                self._add(root)
                self.native.append(root)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    limit = inotify_watch_limit()
                    log.warning(
                        "cannot watch %s: the inotify watch limit is used up "
                        "(fs.inotify.max_user_watches=%s, shared by all processes of this "
                        "user); polling it instead; %s",
                        root,
                        limit if limit is not None else "unknown",
                        limit_advice(limit),
                    )
                else:
                    log.warning("cannot watch %s (%s): polling it", root, exc)
        if not self.native:
            self.stop()

    def rewatch(self, root: Path) -> None:
        """Watch `root` anew: directories that were unreadable got no watch from inotify.

        The kernel refuses a watch on a directory the process may not read;
        once it is readable, adding the tree again adds the watches it lacks.
        """
        if root not in self.native:
            return
        try:
            self._add(root)
        except OSError as exc:
            log.warning("cannot watch %s again (%s): polling it", root, exc)
            self.fall_back(root)

    def fall_back(self, root: Path) -> None:
        """Poll `root` from now on; its watches stay (what they see still arrives early)."""
        if root in self.native:
            self.native.remove(root)

    # -- what a backend provides ------------------------------------------

    def _start(self) -> None: ...

    def _add(self, root: Path) -> None:
        """Watch the tree under `root` (OSError if the root itself cannot be watched)."""
        raise NotImplementedError

    def wait(self, timeout: float) -> bool:
        """Wait at most `timeout` seconds for changes; True if there are some."""
        raise NotImplementedError

    def take(self) -> Changes:
        """The files and directories changed since the last call."""
        raise NotImplementedError

    def catch_up(self) -> None:
        """Add the watches of directories created since the last `take` (kept for it).

        A backend with threads of its own adds them as they come: nothing to do.
        """

    def stop(self) -> None: ...


class InotifyWatcher(Watcher):
    """inotify read on the calling thread: no thread of its own (see inotify.py)."""

    def __init__(self) -> None:
        super().__init__()
        self._tree: inotify.InotifyTree | None = None
        self._held = Changes()  # read by catch_up, handed out by the next take

    def _start(self) -> None:
        self._tree = inotify.InotifyTree()

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


def new_watcher() -> Watcher:
    """inotify on Linux; watchdog's observer (FSEvents, kqueue, ...) elsewhere."""
    if inotify.available():
        return InotifyWatcher()
    from trainsentry.watcher_watchdog import WatchdogWatcher

    return WatchdogWatcher()
