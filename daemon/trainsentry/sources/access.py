"""Log files and directories the daemon may not read: said once, retried, said again when fixed.

A daemon under a dedicated user meets permission mistakes: a job that writes
its logs with umask 077, a run directory created by another user, a root
mounted with the wrong uid. None of it may crash the daemon or flood its log
with one warning per cycle. So a path that cannot be read is named once, with
the error, and retried on every read and sweep. A file is then read from
where it stopped, a directory walked for the logs it holds, and the daemon
says the path is readable again. Until then its points are not lost: they
wait in the file.

A tracker's store that is no store (an `mlflow.db` of random bytes, a SQLite
file without MLflow's tables) is unreadable the same way: said once, with
why, said again when the reason changes and when it reads. What is failing
now is published for `status`, `/api/runs` and `/metrics` (runtime/loop.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)


class AccessProblems:
    """The paths that cannot be read now, and what the OS said about each."""

    def __init__(self, say: Callable[[str], None] | None = None) -> None:
        self._say = say or (lambda text: log.warning("%s", text))
        self._failing: dict[str, str] = {}

    @property
    def failing(self) -> dict[str, str]:
        return dict(self._failing)

    def failed(self, path: str, error: str, advice: str | None = None) -> None:
        """Said once per reason: again only when what the OS or the file says changes."""
        if self._failing.get(path) == error:
            return
        self._failing[path] = error
        advice = advice or (
            "retried on every sweep, and read from where it stopped once it can be "
            "(check the daemon user's permissions)"
        )
        self._say(f"cannot read {path}: {error}; {advice}")

    def readable(self, path: str) -> None:
        if self._failing.pop(path, None) is not None:
            self._say(f"{path} can be read again")

    @property
    def directories(self) -> bool:
        """Some directory cannot be read: sweeps are what will notice when it can."""
        return any(os.path.isdir(p) for p in self._failing)

    def walked(self, top: str, errors: list[OSError]) -> bool:
        """After a walk of `top`: its unreadable directories now; True if one became readable."""
        denied = {os.fsdecode(e.filename): e.strerror or str(e) for e in errors if e.filename}
        prefix = top.rstrip(os.sep) + os.sep
        again = False
        for path in [p for p in self._failing if p == top or p.startswith(prefix)]:
            if path not in denied and os.path.isdir(path):
                self.readable(path)
                again = True
        for path, error in sorted(denied.items()):
            if os.path.exists(path):  # a directory deleted mid-walk is not a permission problem
                self.failed(path, error)
        return again

    def forget(self, path: str) -> None:
        """The path is gone: whatever it could not do is moot."""
        self._failing.pop(path, None)
