"""A run's series are bounded: a new tag per line cannot take the daemon's memory."""

from __future__ import annotations

import logging

import pytest

from trainsentry.point import Row
from trainsentry.store.limits import SeriesLimit


def row(step: int, *tags: str) -> Row:
    return Row(step, 0.0, tags, tuple(float(i) for i in range(len(tags))))


def test_rows_within_the_limit_pass_as_they_are() -> None:
    limit = SeriesLimit(limit=3)
    rows = [row(1, "a", "b"), row(2, "a", "b", "c")]
    assert limit.admit("r", rows) is rows and limit.dropped == 0


def test_new_tags_past_the_limit_are_dropped_said_once_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limit = SeriesLimit(limit=3)
    with caplog.at_level(logging.WARNING):
        out = limit.admit("r", [row(1, "a", "b"), row(2, "c", "d", "a"), row(3, "e")])
        again = limit.admit("r", [row(4, "f", "a")])
    assert [(r.step, r.tags, r.values) for r in out] == [
        (1, ("a", "b"), (0.0, 1.0)),
        (2, ("c", "a"), (0.0, 2.0)),
    ]
    assert [(r.tags, r.values) for r in again] == [(("a",), (1.0,))]
    assert limit.dropped == 3
    assert [r.message for r in caplog.records].count(
        "run r has more than 3 series: values of its further new tags are dropped "
        "(a log writing a new tag per line?)"
    ) == 1
    assert limit.admit("other", [row(1, "x", "y")])[0].tags == ("x", "y")  # per run


def test_a_released_run_starts_with_its_whole_limit_again() -> None:
    limit = SeriesLimit(limit=1)
    limit.admit("r", [row(1, "a", "b")])
    limit.forget("r")
    assert limit.admit("r", [row(1, "b")])[0].tags == ("b",)
