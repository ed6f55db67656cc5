"""Tells the daemon which files may have changed, so it reads only those.

inotify (through watchdog) where the kernel sees the writes; polling where it
cannot: on network filesystems a write from another host raises no event on
this one, so roots on nfs/lustre/gpfs/cifs/fuse/9p are swept on a timer
instead. The event filter leaves out open and close-without-write events:
with the default mask watchdog 7.1 overflows the kernel queue on trees of
thousands of directories, and the daemon's own reads would wake it up.

The kernel's watch limit (fs.inotify.max_user_watches, shared by every
process of the user) is the other trap: watchdog 7.1 raises only when the
root itself cannot be watched and silently skips sub-directories it could not
add. So the watches are counted from the kernel (/proc/self/fdinfo) and
compared with the directories a sweep walked; a root short of watches is
polled instead, with one warning that says how to raise the limit.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import warnings
from pathlib import Path

from watchdog.events import (
    DirAttribEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)

log = logging.getLogger(__name__)

# watchdog warns when a directory tree is created faster than it adds watches
# (nested makedirs): harmless, the watch is replaced, and not the user's concern.
warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)

NETWORK_FS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs",
     "beegfs", "panfs", "afs", "wekafs", "virtiofs"}
)  # fmt: skip

EVENT_FILTER: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    # a chmod that makes a file or directory readable again: IN_ATTRIB is in the
    # kernel mask anyway (FileModifiedEvent asks for it), so this costs no events
    FileAttribEvent,
    DirAttribEvent,
]


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


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self._w = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = [os.fsdecode(event.src_path)]
        if event.dest_path:
            paths.append(os.fsdecode(event.dest_path))
        self._w.mark(paths, is_dir=event.is_directory)


class Watcher:
    """Collects changed paths from watchdog's thread for the daemon's loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: set[str] = set()
        self._dirs: set[str] = set()
        self.wakeup = threading.Event()
        self._observer: object | None = None
        self._handler = _Handler(self)
        self._scheduled: dict[Path, object] = {}
        self.native: list[Path] = []

    def watch(self, roots: list[Path]) -> None:
        """Watch each root natively where inotify works; the rest is left to sweeps.

        The observer starts first, so each `schedule` adds its watches at once
        and a root that cannot be watched (watch limit, permissions) fails
        there, alone, instead of failing `start` for every root.
        """
        from watchdog.observers import Observer

        observer = Observer()
        observer.daemon = True
        observer.start()
        for root in roots:
            if needs_polling(root):
                log.info("%s is on a network filesystem: polling it", root)
                continue
            try:
                self._scheduled[root] = observer.schedule(
                    self._handler, str(root), recursive=True, event_filter=EVENT_FILTER
                )
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
        self._observer = observer
        if not self.native:
            self.stop()

    def rewatch(self, root: Path) -> None:
        """Watch `root` anew: directories that were unreadable got no watch from inotify.

        The kernel refuses a watch on a directory the process may not read,
        and watchdog skips it without a word; once it is readable, only a new
        recursive schedule adds the watches it lacks.
        """
        obs, old = self._observer, self._scheduled.get(root)
        if obs is None or old is None:
            return
        try:
            obs.unschedule(old)  # type: ignore[attr-defined]
            self._scheduled[root] = obs.schedule(  # type: ignore[attr-defined]
                self._handler, str(root), recursive=True, event_filter=EVENT_FILTER
            )
        except OSError as exc:
            log.warning("cannot watch %s again (%s): polling it", root, exc)
            self.fall_back(root)

    def fall_back(self, root: Path) -> None:
        """Poll `root` from now on; its watches stay (what they see still arrives early)."""
        if root in self.native:
            self.native.remove(root)

    def mark(self, paths: list[str], *, is_dir: bool) -> None:
        with self._lock:
            (self._dirs if is_dir else self._files).update(paths)
        self.wakeup.set()

    def take(self) -> tuple[set[str], set[str]]:
        """The files and directories changed since the last call."""
        with self._lock:
            files, dirs = self._files, self._dirs
            self._files, self._dirs = set(), set()
            self.wakeup.clear()
        return files, dirs

    def stop(self) -> None:
        obs = self._observer
        if obs is not None:
            # watchdog logs "queue_events() called when the thread is inactive" at
            # ERROR when an event races the stop; harmless, and not the user's concern.
            wd_log = logging.getLogger("watchdog")
            level = wd_log.level
            wd_log.setLevel(logging.CRITICAL)
            try:
                obs.stop()  # type: ignore[attr-defined]
                obs.join(timeout=5)  # type: ignore[attr-defined]
            finally:
                wd_log.setLevel(level)
            self._observer = None
