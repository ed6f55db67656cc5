"""Tells the daemon which files may have changed, so it reads only those.

inotify where the kernel sees the writes (read on the daemon's own loop,
inotify.py; watchdog on platforms without it, watchdog_backend.py); polling
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
from pathlib import Path

from trainsentry.watching.kernel import inotify_watch_limit, limit_advice, needs_polling

log = logging.getLogger(__name__)


class Changes:
    """Paths changed since the last read; `overflow`: the kernel dropped events."""

    __slots__ = ("dirs", "files", "overflow", "relinked")

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()
        self.overflow = False
        # files named by more than a write (created, moved, deleted, chmod), and
        # directories moved or deleted: the file at such a path (or below such a
        # directory) may no longer be the one a tail has open (runtime.py)
        self.relinked: set[str] = set()


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
