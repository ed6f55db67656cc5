"""Startup progress over existing logs: how many files, points, seconds, then "caught up".

A daemon started on a large log root reads for a while before its alerts are
live; without a word it looks hung. On a terminal a progress bar is redrawn in
place (sinks/console.py); elsewhere — a journal, a file — a plain line every
few seconds reads as "alive and moving" without drowning the log. Both end
with the same "caught up" line, from which point alerts are live.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from trainsentry.stop_signals import signals_deferred
from trainsentry.terminal import render as console

PROGRESS_LOG_SECONDS = 5.0  # a line this often on a log
PROGRESS_TTY_SECONDS = 0.2  # the bar is redrawn this often at most


@dataclass(frozen=True, slots=True)
class Backfill:
    """How far the startup read is, for a progress line: files read to their end so far."""

    files_done: int
    files_total: int
    points: int
    seconds: float
    done: bool
    stopped: bool = False  # the daemon stopped before it caught up; the rest is read next start


def human_count(n: int) -> str:
    """1234567 -> "1.2M": progress lines are read at a glance, not parsed."""
    for size, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


class BackfillReporter:
    def __init__(
        self,
        out: TextIO | None = None,
        *,
        every: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._out = out = out if out is not None else sys.stderr
        self._bar = console.BackfillBar(out) if console.is_rich(out) else None
        if every is None:
            every = PROGRESS_TTY_SECONDS if self._bar is not None else PROGRESS_LOG_SECONDS
        self._every = every
        self._clock = clock
        self._next = clock() + every

    def __call__(self, b: Backfill) -> None:
        if b.done or b.stopped:
            line = (
                f"trainsentry: caught up: {b.files_total} files, {human_count(b.points)} points "
                f"in {b.seconds:.1f} s"
                if b.done
                else f"trainsentry: backfill stopped at {b.files_done}/{b.files_total} files, "
                f"{human_count(b.points)} points; the rest is read at the next start"
            )
            if self._bar is not None:
                self._bar.finish(line, style="green" if b.done else "yellow")
            else:
                self._write(line)
            return
        now = self._clock()
        if now < self._next:
            return
        self._next = now + self._every
        if self._bar is not None:
            self._bar.update(b.files_done, b.files_total, human_count(b.points), b.seconds)
        else:
            self._write(
                f"trainsentry: backfill: {b.files_done}/{b.files_total} files, "
                f"{human_count(b.points)} points, {b.seconds:.1f} s"
            )

    def _write(self, line: str) -> None:
        with signals_deferred():
            self._out.write(line + "\n")
            self._out.flush()
