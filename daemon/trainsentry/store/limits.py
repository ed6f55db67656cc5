"""How many series one run may have: a run that writes a new tag every line must not
take the daemon's memory, or its loop, from every other run.

Each series costs the store a window and the engine its bindings, about a
kilobyte even with one point; a run writing a million distinct tags took a
daemon to 1 GB and its alert-state snapshot to 15 s. Real runs have tens of
series, a model with per-layer statistics a few thousand. So a run's first
MAX_SERIES_PER_RUN tags are kept and the values of any further new tag are
dropped before the store and the rules see them: said once per run, counted
(`dropped`). What a run's rows carry is decided once per row shape, so the
rows of a run within its limit pass with one dictionary lookup each.
"""

from __future__ import annotations

import logging

from trainsentry.point import Row
from trainsentry.sources.names import safe_name

log = logging.getLogger(__name__)

MAX_SERIES_PER_RUN = 10_000
SHAPES_PER_RUN = 4096  # row shapes remembered per run (Shapes.LIMIT, as the decoders)
_new = tuple.__new__


class SeriesLimit:
    def __init__(self, limit: int = MAX_SERIES_PER_RUN) -> None:
        self.limit = limit
        self.dropped = 0  # values dropped for a run over its limit
        self._tags: dict[str, set[str]] = {}  # run → its tags admitted
        # run → row shape → the positions of its values to keep (None: all of them)
        self._shapes: dict[str, dict[tuple[str, ...], tuple[int, ...] | None]] = {}
        self._warned: set[str] = set()

    def admit(self, run: str, rows: list[Row]) -> list[Row]:
        """The rows with the values of tags beyond the run's limit taken out."""
        shapes = self._shapes.get(run)
        if shapes is None:
            shapes = self._shapes[run] = {}
        out: list[Row] | None = None
        for i, row in enumerate(rows):
            tags = row[2]
            try:
                keep = shapes[tags]
            except KeyError:
                if len(shapes) >= SHAPES_PER_RUN:  # a new shape per line: decided afresh
                    shapes.clear()
                keep = shapes[tags] = self._shape(run, tags)
            if keep is None:
                if out is not None:
                    out.append(row)
                continue
            if out is None:
                out = list(rows[:i])
            self.dropped += len(tags) - len(keep)
            if keep:
                step, wall, _, values = row
                kept = tuple(tags[k] for k in keep)
                out.append(_new(Row, (step, wall, kept, tuple(values[k] for k in keep))))
        return rows if out is None else out

    def _shape(self, run: str, tags: tuple[str, ...]) -> tuple[int, ...] | None:
        known = self._tags.get(run)
        if known is None:
            known = self._tags[run] = set()
        new = [t for t in dict.fromkeys(tags) if t not in known]
        room = self.limit - len(known)
        known.update(new[: max(0, room)])
        if len(new) <= room:
            return None
        if run not in self._warned:
            self._warned.add(run)
            log.warning(
                "run %s has more than %d series: values of its further new tags are dropped "
                "(a log writing a new tag per line?)",
                safe_name(run),
                self.limit,
            )
        return tuple(i for i, t in enumerate(tags) if t in known)

    def forget(self, run: str) -> None:
        self._tags.pop(run, None)
        self._shapes.pop(run, None)
        self._warned.discard(run)
