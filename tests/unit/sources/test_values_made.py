"""Rows made into samples and points: the same values in order whatever the rows' shape,
and the garbage collector back as it was after, whatever happened while it was held."""

from __future__ import annotations

import gc

import pytest

from trainsentry.point import Point, Row, Sample, no_collection, points_of, samples_of


def _rows(widths: list[int]) -> list[Row]:
    return [
        Row(
            step,
            step * 0.5,
            tuple(f"t{step}.{k}" for k in range(n)),
            tuple(float(k) for k in range(n)),
        )
        for step, n in enumerate(widths)
    ]


@pytest.mark.parametrize("widths", [[1, 1, 1], [3, 1, 2], [1, 1, 4], [0, 1], [], [2]])
def test_samples_and_points_are_each_value_in_order(widths: list[int]) -> None:
    rows = _rows(widths)
    want = [
        (tag, r.step, r.wall_time, v) for r in rows for tag, v in zip(r.tags, r.values, strict=True)
    ]
    assert samples_of(rows) == [Sample(*w) for w in want]
    assert points_of("run", iter(rows)) == [Point("run", *w) for w in want]
    assert all(type(s) is Sample for s in samples_of(rows))


def test_a_row_whose_values_do_not_match_its_tags_is_refused() -> None:
    with pytest.raises(ValueError):
        samples_of([Row(0, 0.0, ("a",), (1.0, 2.0)), Row(1, 0.0, ("b",), (3.0,))])


def test_the_collector_is_held_off_and_then_as_it_was() -> None:
    assert gc.isenabled()
    with no_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), no_collection():
        raise RuntimeError("a decoder's bug")
    assert gc.isenabled()
    gc.disable()
    try:
        with no_collection():
            pass
        assert not gc.isenabled()  # a caller that held it off keeps it off
    finally:
        gc.enable()
