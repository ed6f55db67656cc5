"""`forward_time`: how long a step's first training forward takes on this rank.

In a DDP job the ranks first wait for one another in backward (the gradient
all-reduce runs there), so backward time holds the wait for the slowest rank
and says nothing about which rank that is. A rank's own time up to its first
collective is its data wait plus its forward: a rank slower there than its
peers is the one they wait for. So the probe times the step's first training
forward, from the end of the root module's forward pre-hook (after the probe's
own work there) to the start of its forward hook; later forwards of the step
(gradient accumulation's micro-batches) are not timed.

On the CPU the two ends are `time.perf_counter()` readings. On CUDA the host
only queues kernels, and its clock would time their launches, not the
compute: the ends are a pair of timing events recorded on the device's
current stream. The time between them is the device's through the forward's
kernels, gaps where it waited for the host's launches included, so a forward
bound by either shows. It is read on the writer thread once the step's batch
has reached the host (transfer.py), when the events are complete (the
batch's copy, or its marker event, was queued after them on the same
stream). The training loop never waits for them; an event not complete by
then (a forward on another stream) leaves the value out rather than wait.
"""

from __future__ import annotations

import time
from typing import Any

import torch

_IDLE, _ARMED, _RUNNING = 0, 1, 2


class ForwardClock:
    """Times the first training forward of each step it is armed for."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda" and torch.cuda.is_available()
        self.device = device
        self._state = _IDLE
        self._start: Any = None

    def arm(self, due: bool) -> None:
        """A step began: its first forward is timed when the step tier is `due`."""
        self._state = _ARMED if due else _IDLE
        self._start = None

    def start(self) -> None:
        """At the end of the root module's forward pre-hook."""
        if self._state != _ARMED:
            return
        self._state = _RUNNING
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._start.record(torch.cuda.current_stream(self.device))
        else:
            self._start = time.perf_counter()

    def stop(self, host: dict[str, Any]) -> None:
        """At the start of the root module's forward hook: the value (or, on CUDA, the
        pair of events to read it from later) goes into the step's host values."""
        if self._state != _RUNNING:
            return
        self._state = _IDLE
        start, self._start = self._start, None
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record(torch.cuda.current_stream(self.device))
            host["forward_events"] = (start, end)
        else:
            host["forward_time"] = time.perf_counter() - start


def elapsed(events: tuple[Any, Any]) -> float | None:
    """Seconds between two recorded CUDA events; None while they are not complete
    (never waits for them)."""
    start, end = events
    try:
        if not end.query():
            return None
        return float(start.elapsed_time(end)) / 1000.0
    except RuntimeError:  # not complete on its own stream yet, or a broken context
        return None
