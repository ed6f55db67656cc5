"""The last lines of each run's text logs: the job's own words beside the curve.

A person paged for a loss divergence or a stall wants to see what the job
printed around then (a warning about a bad batch, a checkpoint that failed to
save, a NCCL retry) without logging into the node. So every text event's
lines are kept here, per run, in a ring of LINES_PER_RUN lines, each cut at
the decoder's line limit (sources/text_events.py, 2,000 characters): at most
~200 kB per run that has text logs, nothing for a run that has none. Lines
are masked for secrets before they get here (sources/secrets.py); the
incident bundle quotes the last 50 read when its alert fired.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterable

from trainsentry.point import TextEvent
from trainsentry.sources.text_scan import PLAIN, plain_lines

LINES_PER_RUN = 100
BUNDLE_LINES = 50  # lines an incident bundle quotes


class LogLines:
    """Per run: (path, line number, text) of its recent text-log lines."""

    def __init__(self, per_run: int = LINES_PER_RUN) -> None:
        self._per_run = per_run
        self._runs: dict[str, deque[tuple[str, int, str]]] = {}

    def extend(self, events: Iterable[TextEvent]) -> None:
        """Each event's lines to its run's (a log of many ranks' lines feeds several)."""
        run, ring = "", None
        for event in events:
            if ring is None or event.run != run:
                run = event.run
                ring = self._runs.get(run)
                if ring is None:
                    ring = self._runs[run] = deque(maxlen=self._per_run)
            if event.kind == PLAIN:  # many lines: only the last can stay
                ring.extend((event.path, n, text) for n, text in plain_lines(event, self._per_run))
                continue
            for k, text in enumerate(event.lines):
                ring.append((event.path, event.line + k, text))

    def last(self, run: str, count: int = BUNDLE_LINES) -> list[dict[str, object]]:
        """The run's last `count` lines, oldest first: what the job said up to the alert
        (a bundle is written as its alert fires, from what was read by then)."""
        ring = self._runs.get(run)
        if not ring:
            return []
        lines = list(ring)[-count:]
        return [
            {"path": os.path.basename(path), "line": number, "text": text}
            for path, number, text in lines
        ]

    def forget(self, run: str) -> None:
        self._runs.pop(run, None)
