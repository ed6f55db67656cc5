"""The one record that flows from sources to rules.

Sources emit `Sample`s (no run: a decoder knows only its file); the tailer
attaches the run and tag prefix and hands `Point`s on. Both are NamedTuples
because millions are created per second on backfill and a tuple is the
cheapest immutable record CPython has.
"""

from __future__ import annotations

from typing import NamedTuple


class Sample(NamedTuple):
    tag: str
    step: int
    wall_time: float
    value: float


class Point(NamedTuple):
    run: str
    tag: str
    step: int
    wall_time: float
    value: float

    def as_dict(self) -> dict[str, object]:
        """The point line of DESIGN.md (`dump --format jsonl`)."""
        return {
            "run": self.run,
            "tag": self.tag,
            "step": self.step,
            "wall_time": self.wall_time,
            "value": self.value,
        }
