"""The last lines of each run's text logs: the job's own words beside the curve.

A person paged for a loss divergence or a stall wants to see what the job
printed around then (a warning about a bad batch, a checkpoint that failed to
save, a NCCL retry) without logging into the node. So every text event's
lines are kept here, per run, in a ring of LINES_PER_RUN lines, each cut at
the decoder's line limit (sources/text_events.py, 2,000 characters): at most
~200 kB per run that has text logs, nothing for a run that has none. Lines
are masked for secrets before they get here (sources/secrets.py); the
incident bundle quotes the last of them before the alert's time.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable

from trainsentry.point import TextEvent

LINES_PER_RUN = 100
BUNDLE_LINES = 50  # lines an incident bundle quotes


class LogLines:
    """Per run: (wall time, path, line number, text) of its recent text-log lines."""

    def __init__(self, per_run: int = LINES_PER_RUN) -> None:
        self._per_run = per_run
        self._runs: dict[str, deque[tuple[float, str, int, str]]] = {}

    def extend(self, run: str, events: Iterable[TextEvent]) -> None:
        ring = self._runs.get(run)
        if ring is None:
            ring = self._runs[run] = deque(maxlen=self._per_run)
        for event in events:
            for k, text in enumerate(event.lines):
                ring.append((event.wall_time, event.path, event.line + k, text))

    def around(self, run: str, wall: float, count: int = BUNDLE_LINES) -> list[dict[str, object]]:
        """The last `count` lines read up to `wall` (all of them if `wall` is not a time)."""
        ring = self._runs.get(run)
        if not ring:
            return []
        known = wall == wall and wall not in (float("inf"), float("-inf"))
        lines = [x for x in ring if not known or x[0] <= wall + 1.0] if known else list(ring)
        return [
            {"path": os.path.basename(path), "line": number, "text": text}
            for _, path, number, text in lines[-count:]
        ]

    def forget(self, run: str) -> None:
        self._runs.pop(run, None)
