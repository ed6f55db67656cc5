"""Each run's trace (sources/run_trace.py), as the incident bundle and /api/runs show it.

Kept in memory beside the run's series and released with them. A trace is
small (tens of params), but a config of thousands of keys must not grow a
fleet's daemon without end: a run keeps at most ENTRIES_PER_RUN entries,
the first ones read (a run's params come at its start; later keys are rarely
what identifies it).
"""

from __future__ import annotations

from trainsentry.point import Trace

ENTRIES_PER_RUN = 1000


class RunTraces:
    def __init__(self, per_run: int = ENTRIES_PER_RUN) -> None:
        self._per_run = per_run
        self._runs: dict[str, Trace] = {}
        self._counts: dict[str, int] = {}

    def add(self, run: str, trace: Trace) -> None:
        """Merge what a source read of the run's trace; a key read again is updated."""
        have = self._runs.setdefault(run, {})
        count = self._counts.get(run, 0)
        for name, entries in trace.items():
            into = have.setdefault(name, {})
            for key, value in entries.items():
                if key not in into:
                    if count >= self._per_run:
                        continue
                    count += 1
                into[key] = value
        self._counts[run] = count

    def of(self, run: str) -> Trace:
        """The run's trace, sections and keys in sorted order ({} when none was read)."""
        trace = self._runs.get(run, {})
        return {name: dict(sorted(e.items())) for name, e in sorted(trace.items()) if e}

    def forget(self, run: str) -> None:
        self._runs.pop(run, None)
        self._counts.pop(run, None)
