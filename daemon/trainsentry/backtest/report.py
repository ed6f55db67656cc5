"""`trainsentry replay ... --report FILE.html`: a backtest a person can read.

The replay's transitions say *what* fired; a rule author also needs to see
*why* — the series the rule watched, when it fired against where the run
actually went bad — and, when changing a pack, what the change gained and
lost on the same history. The points are read once and replayed under each
pack through the same engine `run` uses (replay.replay_transitions).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from trainsentry.backtest.data import build_runs, group_points
from trainsentry.backtest.replay import replay_transitions
from trainsentry.point import Point, ProbeMark, RunEnd, TextEvent
from trainsentry.rules.model import RuleSet
from trainsentry.rules.run_life import RunLife

__all__ = ["build_report", "write_report"]


def build_report(
    points: Iterable[Point],
    rules: RuleSet,
    *,
    compare: RuleSet | None = None,
    label: str = "default pack",
    compare_label: str = "B",
    title: str = "trainsentry backtest",
    order: Literal["time", "input"] = "time",
    events: Iterable[TextEvent] = (),
    marks: Iterable[ProbeMark] = (),
    ends: Iterable[RunEnd] = (),
) -> str:
    """The HTML text of the report; `compare` adds the pack-against-pack section.

    `order`, `events`, `marks` and `ends` (how the trackers say their runs ended)
    as in replay_transitions: "input" for reading.iter_points, already in the
    order a live daemon judges the points.
    """
    from trainsentry.backtest.compare import compare_runs, compare_section
    from trainsentry.backtest.page import (
        header,
        jobs_section,
        page,
        runs_section,
        summary_section,
    )

    feed = list(points)
    said, closed, ended = list(events), list(marks), list(ends)  # replayed under each pack
    grouped = group_points(feed)
    lives: dict[str, RunLife] = {}
    replayed = replay_transitions(
        feed, rules, order=order, events=said, marks=closed, ends=ended, lives=lives
    )
    runs = build_runs(grouped, replayed, lives)
    body = [header(title, runs, rules, label), summary_section(runs), jobs_section(runs)]
    if compare is not None:
        again = replay_transitions(
            feed, compare, order=order, events=said, marks=closed, ends=ended
        )
        other = build_runs(grouped, again)
        body.append(compare_section(compare_runs(runs, other), label, compare_label))
    body.append(runs_section(runs, rules))
    return page(title, body)


def write_report(path: Path, text: str) -> None:
    """Write atomically: a half-written report in a browser tab is worse than none."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
