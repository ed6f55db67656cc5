"""A clock the test sets by hand, for code that takes its clock as an argument.

What depends on time (grouping waits, reminders, watchdog intervals, progress
rates) is checked by moving `now`, never by sleeping.
"""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
