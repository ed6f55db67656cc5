"""The watcher on platforms without inotify: watchdog's observer (FSEvents, kqueue, ...).

watchdog's threads deliver events; they are gathered under a lock for the
daemon's loop, which waits on an Event. The event filter leaves out open and
close-without-write events, as on Linux (watcher.py).
"""

from __future__ import annotations

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

from trainsentry.watching.watcher import Changes, Watcher

# watchdog warns when a directory tree is created faster than it adds watches
# (nested makedirs): harmless, the watch is replaced, and not the user's concern.
warnings.filterwarnings("ignore", message="Callback with id", category=RuntimeWarning)

EVENT_FILTER: list[type[FileSystemEvent]] = [
    FileCreatedEvent,
    FileModifiedEvent,
    FileClosedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileAttribEvent,  # a chmod that makes a file or directory readable again
    DirAttribEvent,
]


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: WatchdogWatcher) -> None:
        self._w = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        paths = [os.fsdecode(event.src_path)]
        if event.dest_path:
            paths.append(os.fsdecode(event.dest_path))
        self._w.mark(paths, is_dir=event.is_directory)


class WatchdogWatcher(Watcher):
    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._changes = Changes()
        self._wakeup = threading.Event()
        self._observer: object | None = None
        self._handler = _Handler(self)
        self._scheduled: dict[Path, object] = {}

    def _start(self) -> None:
        """The observer starts first, so each `schedule` adds its watches at once
        and a root that cannot be watched fails there, alone."""
        from watchdog.observers import Observer

        observer = Observer()
        observer.daemon = True
        observer.start()
        self._observer = observer

    def _add(self, root: Path) -> None:
        obs = self._observer
        assert obs is not None
        old = self._scheduled.pop(root, None)
        if old is not None:
            obs.unschedule(old)  # type: ignore[attr-defined]
        self._scheduled[root] = obs.schedule(  # type: ignore[attr-defined]
            self._handler, str(root), recursive=True, event_filter=EVENT_FILTER
        )

    def mark(self, paths: list[str], *, is_dir: bool) -> None:
        with self._lock:
            changes = self._changes
            (changes.dirs if is_dir else changes.files).update(paths)
            if not is_dir:  # which events named them is not kept: check every path
                changes.relinked.update(paths)
        self._wakeup.set()

    def wait(self, timeout: float) -> bool:
        return self._wakeup.wait(timeout)

    def take(self) -> Changes:
        with self._lock:
            changes, self._changes = self._changes, Changes()
            self._wakeup.clear()
        return changes

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
