"""Stopping on SIGTERM/SIGINT without tearing what is being written.

CPython loses the rest of a large write to a pipe when a signal with a Python
handler interrupts it part-way (seen with 3.11: the reader gets half a JSON
line, then whatever is written next). Output that other programs parse (point
and alert lines) is therefore written with the stop signals blocked; a stop
requested meanwhile is delivered right after the write.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def on_stop(handler: Callable[[], object]) -> None:
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: handler())


@contextmanager
def signals_deferred() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
