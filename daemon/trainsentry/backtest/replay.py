"""`trainsentry replay`: finished runs through the live engine, as a backtest.

The engine is the one `run` uses; only the order of points is decided here.
reading.iter_points already gives a backtest's points in the order a live
daemon judges them (files merged by wall time, each in file order), so the
command line feeds them as they come (order="input"). Points from elsewhere
(synthetic series, one tag after another) are sorted by wall time first
(order="time", stable, so ties keep their input order).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from typing import Literal, TextIO

from trainsentry.alert import Transition
from trainsentry.point import CHECKPOINT_PREFIX, Point, ProbeMark, Row, RunEnd, TextEvent
from trainsentry.rules.engine import Engine
from trainsentry.rules.loader import RuleFileError, load_rules
from trainsentry.rules.log_rules import LogEngine
from trainsentry.rules.model import RuleSet
from trainsentry.rules.run_life import RunLife
from trainsentry.sources.reading import wall_order
from trainsentry.terminal.plain import format_text

__all__ = ["RuleFileError", "load_rules", "replay", "replay_transitions"]


def replay_transitions(
    points: Iterable[Point],
    rules: RuleSet | None = None,
    *,
    order: Literal["time", "input"] = "time",
    events: Iterable[TextEvent] = (),
    ends: Iterable[RunEnd] = (),
    marks: Iterable[ProbeMark] = (),
    lives: dict[str, RunLife] | None = None,
) -> list[Transition]:
    """Every transition of the runs in `points`, ending each run with "run finished".

    A finished run's text events (reading.iter_events) and the probe's end records
    (`marks`, filled by reading.iter_points) are judged once its points are in: a
    text log read after the fact has no time of its own but its file's, which is
    the run's end. A run they say crashed ends with "run crashed: <cause>", as does
    one its tracker says ended so (`ends`, reading.iter_ends), unless its logs told
    how first. There is no process to look at: a probe file without an end record
    is a run that stopped, as it would be to a daemon on another host. `lives`,
    when given, receives each run's life as the replay ends it (the report shows
    them).
    """
    ruleset = rules if rules is not None else load_rules()
    engine = Engine(ruleset)
    feed = sorted(points, key=wall_order) if order == "time" else points
    texts = LogEngine(ruleset)
    ends = list(ends)
    judged_by_texts = texts.rules or texts.restart_rules or texts.overdue_rules or texts.lost_rules
    if not judged_by_texts and not ends:
        out = engine.feed_all(feed)
        out.extend(engine.finish_all())
        if lives is not None:
            lives.update({t.run: RunLife("finished") for t in out if t.run not in lives})
        return out
    last: dict[str, Point] = {}
    restarts: list[Transition] = []  # a job's attempts, judged record by record as live
    out = engine.feed_all(_noting(feed, last, texts, restarts))
    out.extend(restarts)
    for run, point in last.items():
        out.extend(texts.saw(run, point.step, point.wall_time))
    out.extend(texts.feed(events))
    out.extend(texts.tick(math.inf))  # the ranks' held timeouts: all are in (rules/hang.py)
    out.extend(texts.marked(marks))
    for end in ends:
        out.extend(texts.reported(end.run, end.state, end.cause, end.wall))
    for run, life in texts.ended:
        out.extend(engine.finish(run, life.reason))
    if lives is not None:
        for run, life in texts.lives().items():  # a replay's runs are over: finished, or how
            lives[run] = life if life.ended else RunLife("finished", step=life.step)
    for run in texts.lives():
        out.extend(texts.finish(run))
    out.extend(engine.finish_all())
    return out


def _noting(
    points: Iterable[Point], last: dict[str, Point], texts: LogEngine, restarts: list[Transition]
) -> Iterator[Point]:
    """The points on, each record told to the text engine (a job's attempts and
    checkpoints): once per record of a run, and every checkpoint's value (a checkpoint
    is a save, not a record the run logged: it is no run's last point)."""
    for point in points:
        if point.tag.startswith(CHECKPOINT_PREFIX):
            row = Row(point.step, point.wall_time, (point.tag,), (point.value,))
            restarts.extend(texts.stepped(point.run, (row,)))
            yield point
            continue
        before = last.get(point.run)
        last[point.run] = point
        if before is None or (before.step, before.wall_time) != (point.step, point.wall_time):
            row = Row(point.step, point.wall_time, (point.tag,), (point.value,))
            restarts.extend(texts.stepped(point.run, (row,)))
        yield point


def replay(
    points: Iterable[Point],
    rules: RuleSet | None = None,
    *,
    out: TextIO,
    fmt: str = "jsonl",
    order: Literal["time", "input"] = "time",
    events: Iterable[TextEvent] = (),
    ends: Iterable[RunEnd] = (),
    marks: Iterable[ProbeMark] = (),
) -> int:
    """Print the transitions as JSON lines or a text timeline; returns how many.

    The text timeline is plain lines, except on a terminal, where console.py
    groups it per run and ends with a table of the runs.
    """
    if fmt not in ("jsonl", "text"):
        raise ValueError(f"unknown format {fmt!r}; expected jsonl or text")
    transitions = replay_transitions(
        points, rules, order=order, events=events, ends=ends, marks=marks
    )
    if fmt == "text":
        from trainsentry.terminal import render as console

        if console.is_rich(out):
            console.print_replay(console.console_for(out), transitions)
            return len(transitions)
    for t in transitions:
        if fmt == "jsonl":
            out.write(json.dumps(t.as_dict(), ensure_ascii=False) + "\n")
        else:
            out.write(format_text(t) + "\n")
    if fmt == "text":
        runs = len({t.run for t in transitions})
        fired = sum(1 for t in transitions if t.state == "firing")
        out.write(f"{fired} firing transitions in {runs} run(s)\n" if fired else "no alerts\n")
    return len(transitions)
