"""Which files may have changed: inotify read on the daemon's own loop, watchdog's
observer where there is no inotify, and sweeps where no event can be trusted."""

from __future__ import annotations

from trainsentry.watching import inotify
from trainsentry.watching.watcher import Changes, Watcher

__all__ = ["Changes", "Watcher", "new_watcher"]


def new_watcher() -> Watcher:
    """inotify on Linux; watchdog's observer (FSEvents, kqueue, ...) elsewhere."""
    if inotify.available():
        return inotify.InotifyWatcher()
    from trainsentry.watching.watchdog_backend import WatchdogWatcher

    return WatchdogWatcher()
