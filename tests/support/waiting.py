"""Waiting for something a process or thread does, with one rule for giving up.

Tests wait on what they can observe (a file, an API answer, a row in the
state) instead of sleeping a guessed time: success returns as soon as it
happens, and a failure after the generous timeout says what never happened
and how long was waited, so a slow machine reads differently from a broken one.
"""

from __future__ import annotations

import time
from collections.abc import Callable

WAIT = 60.0
EVERY = 0.05


class Deadline:
    def __init__(self, timeout: float = WAIT) -> None:
        self._start = time.monotonic()
        self._timeout = timeout

    def left(self, what: str | Callable[[], str]) -> float:
        """The seconds left; past the deadline, an AssertionError saying `what` was awaited.

        `what` may be a function, for a message that is costly to build or shows
        the latest output: it is called only on failure.
        """
        waited = time.monotonic() - self._start
        if waited < self._timeout:
            return self._timeout - waited
        said = what() if callable(what) else what
        raise AssertionError(f"waited {waited:.1f} s for: {said}")


def wait_until(
    check: Callable[[], object], what: str, timeout: float = WAIT, every: float = EVERY
) -> None:
    """Until `check()` is true, looked at every `every` seconds, or fail saying `what`."""
    deadline = Deadline(timeout)
    while not check():
        time.sleep(min(every, deadline.left(what)))
