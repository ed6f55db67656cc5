"""The store: bounded series, rewinds and repeated steps, runs released."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsentry.point import Point, Row, points_of
from trainsentry.store import Bucket, Series, Store


def point(step: int, value: float = 0.0, tag: str = "loss", run: str = "exp/a") -> Point:
    return Point(run, tag, step, 1_700_000_000.0 + step, value)


def steps(series: Series) -> list[int]:
    return [p.step for p in series.recent()]


def accounted(series: Series) -> int:
    return len(series.recent()) + sum(b.count for b in series.history())


def test_recent_keeps_the_last_n_points_in_order() -> None:
    store = Store(recent_size=5)
    for step in range(12):
        store.add(point(step, float(step)))
    series = store.get("exp/a", "loss")
    assert series is not None
    assert steps(series) == [7, 8, 9, 10, 11]
    assert series.last == point(11, 11.0)
    assert series.count == 12


def test_points_leaving_the_window_are_summarised_per_step_bucket() -> None:
    store = Store(recent_size=2, bucket_steps=10)
    for step in range(0, 30, 2):
        store.add(point(step, float(step)))
    series = store.get("exp/a", "loss")
    assert series is not None
    assert steps(series) == [26, 28]
    assert series.history() == [
        Bucket(0, 8, 5, 0, 0.0, 8.0, 4.0, 8.0),
        Bucket(10, 18, 5, 0, 10.0, 18.0, 14.0, 18.0),
        Bucket(20, 24, 3, 0, 20.0, 24.0, 22.0, 24.0),
    ]


def test_nan_values_are_counted_but_kept_out_of_min_max_and_mean() -> None:
    store = Store(recent_size=1, bucket_steps=100)
    for step, value in enumerate([1.0, math.nan, 3.0, math.nan, 0.0]):
        store.add(point(step, value))
    series = store.get("exp/a", "loss")
    assert series is not None
    (bucket,) = series.history()
    assert (bucket.count, bucket.nan_count, bucket.min, bucket.max, bucket.mean) == (
        4,
        2,
        1.0,
        3.0,
        2.0,
    )
    assert math.isnan(bucket.last)


def test_a_bucket_of_only_nan_reports_nan_summaries() -> None:
    store = Store(recent_size=1)
    store.add(point(0, math.nan))
    store.add(point(1, 1.0))
    series = store.get("exp/a", "loss")
    assert series is not None
    (bucket,) = series.history()
    assert bucket.nan_count == 1 and math.isnan(bucket.min) and math.isnan(bucket.mean)


def test_memory_stays_bounded_over_a_million_points() -> None:
    store = Store(recent_size=1000, bucket_steps=100, max_buckets=1000)
    add = store.add
    for step in range(1_000_000):
        add(Point("exp/a", "loss", step, 0.0, 1.0))
    series = store.get("exp/a", "loss")
    assert series is not None
    history = series.history()
    assert len(series.recent()) == 1000
    assert len(history) <= 1000 + 1
    assert accounted(series) == series.count == 1_000_000
    # Coarsened, but still covering the whole run from its first step.
    assert history[0].first_step == 0
    assert history[-1].last_step == 1_000_000 - 1000 - 1
    assert series.bucket_steps >= (1_000_000 - 1000) // 1000


def test_a_rewind_starts_a_new_segment_and_drops_the_abandoned_steps_from_recent() -> None:
    store = Store(recent_size=100)
    for step in range(0, 60, 10):
        store.add(point(step, 1.0))
    series = store.add(point(30, 2.0))  # restarted from the checkpoint at step 30
    assert series.segment == 1
    assert steps(series) == [0, 10, 20, 30]
    assert series.last.value == 2.0
    # The abandoned steps 30..50 are history now, not lost.
    assert [(b.first_step, b.last_step, b.count) for b in series.history()] == [(30, 50, 3)]
    store.add(point(40, 2.0))
    assert steps(series) == [0, 10, 20, 30, 40]
    assert series.segment == 1


def test_a_repeated_step_replaces_the_newest_point_without_a_new_segment() -> None:
    store = Store()
    store.add(point(5, 1.0))
    store.add(point(6, 1.0))
    series = store.add(point(6, 3.0))
    assert series.segment == 0
    assert [(p.step, p.value) for p in series.recent()] == [(5, 1.0), (6, 3.0)]
    assert store.last_point("exp/a", "loss") == point(6, 3.0)
    assert accounted(series) == series.count == 3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=300), max_size=400),
    st.integers(min_value=1, max_value=8),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=2, max_value=6),
)
def test_every_point_is_in_exactly_one_place_and_recent_steps_increase(
    step_list: list[int], recent_size: int, bucket_steps: int, max_buckets: int
) -> None:
    store = Store(recent_size=recent_size, bucket_steps=bucket_steps, max_buckets=max_buckets)
    rewinds = 0
    for i, step in enumerate(step_list):
        if i and step < step_list[i - 1]:
            rewinds += 1
        store.add(point(step, float(i)))
    series = store.get("exp/a", "loss")
    if not step_list:
        assert series is None
        return
    assert series is not None
    recent = steps(series)
    assert recent == sorted(set(recent))
    assert len(recent) <= recent_size
    assert len(series.history()) <= max_buckets + 1
    assert accounted(series) == series.count == len(step_list)
    assert series.segment == rewinds
    assert series.last.value == float(len(step_list) - 1)


def test_runs_series_and_last_point_are_per_run_and_tag() -> None:
    store = Store()
    store.add(point(1, 0.5, tag="loss", run="a"))
    store.add(point(1, 0.1, tag="lr", run="a"))
    store.add(point(2, 0.7, tag="loss", run="b"))
    assert store.runs() == ["a", "b"]
    assert sorted(store.series("a")) == ["loss", "lr"]
    assert store.last_point("b", "loss") == point(2, 0.7, run="b")
    assert store.last_point("b", "lr") is None
    assert store.last_point("c", "loss") is None
    assert store.series("c") == {}


def test_a_released_run_is_forgotten_and_others_are_kept() -> None:
    store = Store()
    store.extend([point(1, run="a"), point(1, run="b")])
    assert store.release_run("a") is True
    assert store.release_run("a") is False
    assert store.runs() == ["b"]
    assert store.get("a", "loss") is None


def test_a_configuration_that_cannot_bound_memory_is_rejected() -> None:
    with pytest.raises(ValueError):
        Store(recent_size=0)
    with pytest.raises(ValueError):
        Store(max_buckets=1)


def test_a_step_beyond_64_bits_is_kept_at_the_limit_instead_of_failing() -> None:
    store = Store(recent_size=3)
    store.add(point(1))
    store.add(point(10**30))
    series = store.get("exp/a", "loss")
    assert series is not None
    assert steps(series) == [1, (1 << 63) - 1]
    assert series.last.step == 10**30  # the newest point as it was added


def test_a_series_no_rule_reads_keeps_a_short_window_and_the_judged_one_its_full() -> None:
    from trainsentry.rules.engine import Engine
    from trainsentry.rules.loader import load_rules
    from trainsentry.store.runs import SIDE_RECENT

    store = Store(recent_size=500, judged=Engine(load_rules()).reads)
    for step in range(1000):
        store.add(Point("r", "train/loss", step, float(step), 1.0))
        store.add(Point("r", "my/custom_counter", step, float(step), 1.0))
    judged, side = store.get("r", "train/loss"), store.get("r", "my/custom_counter")
    assert judged is not None and side is not None
    assert len(judged.recent()) == 500 and len(side.recent()) == SIDE_RECENT
    # what left the judged window is in its history; the side one's is only counted
    assert len(judged.recent()) + sum(b.count for b in judged.history()) == 1000
    assert side.history() == [] and side.count == 1000
    assert [p.step for p in side.recent()] == list(range(1000 - SIDE_RECENT, 1000))


def folded_one_by_one(
    adds: list[tuple[int, float]], recent_size: int, width: int
) -> list[tuple[int, int, int, int, float, float, float, float]]:
    """The history a point-at-a-time fold gives: each point summarised as it leaves."""
    recent: list[tuple[int, float]] = []
    buckets: list[list[float]] = []

    def fold(step: int, value: float) -> None:
        b = buckets[-1] if buckets else None
        if b is None or step // width != b[0] // width or step < b[1]:
            b = [step, step, 0, 0, math.inf, -math.inf, 0.0, value]
            buckets.append(b)
        b[1], b[7] = step, value
        b[2] += 1
        if math.isnan(value):
            b[3] += 1
        else:
            b[4], b[5], b[6] = min(b[4], value), max(b[5], value), b[6] + value

    for step, value in adds:
        if recent and step <= recent[-1][0]:
            for s, v in [p for p in recent if p[0] >= step]:
                fold(s, v)
            recent = [p for p in recent if p[0] < step]
        elif len(recent) == recent_size:
            fold(*recent.pop(0))
        recent.append((step, value))
    out = []
    for b in buckets:
        finite = b[2] - b[3]
        mean = b[6] / finite if finite else math.nan
        low, high = (b[4], b[5]) if finite else (math.nan, math.nan)
        out.append((int(b[0]), int(b[1]), int(b[2]), int(b[3]), low, high, mean, b[7]))
    return out


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=-50, max_value=400),
            st.one_of(st.floats(-1e6, 1e6), st.just(math.nan)),
        ),
        max_size=300,
    ),
    st.integers(min_value=1, max_value=40),
    st.integers(min_value=1, max_value=30),
)
def test_history_folded_a_prefix_at_a_time_equals_folding_each_point_as_it_leaves(
    adds: list[tuple[int, float]], recent_size: int, width: int
) -> None:
    store = Store(recent_size=recent_size, bucket_steps=width, max_buckets=10_000)
    for step, value in adds:
        store.add(point(step, value))
    series = store.get("exp/a", "loss")
    got = [] if series is None else series.history()
    want = folded_one_by_one(adds, recent_size, width)
    assert [(b.first_step, b.last_step, b.count, b.nan_count) for b in got] == [w[:4] for w in want]
    for b, w in zip(got, want, strict=True):
        assert b.min == w[4] or (math.isnan(b.min) and math.isnan(w[4]))
        assert b.max == w[5] or (math.isnan(b.max) and math.isnan(w[5]))
        assert b.mean == pytest.approx(w[6], rel=1e-9, abs=1e-6, nan_ok=True)
        assert b.last == w[7] or (math.isnan(b.last) and math.isnan(w[7]))


def _bucket_rows(series: Series) -> list[tuple[object, ...]]:
    """History as comparable tuples: NaN stands for itself; means to 9 digits (the order
    of additions differs between a column folded at once and points one by one)."""
    return [
        tuple("nan" if isinstance(v, float) and math.isnan(v) else round(v, 9) for v in fields)
        for fields in (
            (b.first_step, b.last_step, b.count, b.nan_count, b.min, b.max, b.mean, b.last)
            for b in series.history()
        )
    ]


def _points(series: Series) -> list[tuple[object, ...]]:
    return [(*p[:4], "nan" if math.isnan(p.value) else p.value) for p in series.recent()]


SHAPES = [("loss",), ("loss", "lr"), ("lr", "grad_norm", "loss"), ("grad_norm", "grad_norm")]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(range(len(SHAPES))),
            st.integers(min_value=-3, max_value=6),  # step increments: rewinds, repeats
            st.booleans(),  # read the store after this batch
            st.integers(min_value=1, max_value=25),  # rows in the batch
        ),
        max_size=40,
    ),
    st.integers(min_value=1, max_value=30),
)
def test_rows_filed_a_column_at_a_time_equal_points_added_one_by_one(
    batches: list[tuple[int, int, bool, int]], recent_size: int
) -> None:
    by_rows = Store(recent_size=recent_size, bucket_steps=4, max_buckets=8)
    by_points = Store(recent_size=recent_size, bucket_steps=4, max_buckets=8)
    step = 0
    for shape_index, increment, read, count in batches:
        shape = SHAPES[shape_index]
        rows = []
        for k in range(count):
            step += increment if k == 0 else 1
            values = tuple(
                float(step * 10 + i) if step % 7 else math.nan for i in range(len(shape))
            )
            rows.append(Row(step, 1000.0 + step, shape, values))
        by_rows.extend_rows("exp/a", rows)
        for p in points_of("exp/a", rows):
            by_points.add(p)
        if read:
            assert list(by_rows.newest()) == list(by_points.newest())
    assert list(by_rows.newest()) == list(by_points.newest())
    got, want = by_rows.series("exp/a"), by_points.series("exp/a")
    assert sorted(got) == sorted(want)
    for tag, series in want.items():
        mine = got[tag]
        assert _bucket_rows(mine) == _bucket_rows(series)  # folds what left the window first
        assert (mine.count, mine.segment, mine.bucket_steps) == (
            series.count,
            series.segment,
            series.bucket_steps,
        )
        assert mine.last[:4] == series.last[:4]
        assert mine.last.value == series.last.value or math.isnan(series.last.value)
        assert _points(mine) == _points(series)


@pytest.mark.parametrize("rows", [1, 20], ids=["waiting", "backlog"])
def test_a_row_step_beyond_64_bits_is_filed_at_the_limit_like_a_point(rows: int) -> None:
    store = Store()
    batch = [Row(step, 1.0, ("loss",), (float(step),)) for step in range(rows - 1)]
    store.extend_rows("exp/a", [*batch, Row(1 << 70, 2.0, ("loss",), (7.0,))])
    series = store.get("exp/a", "loss")
    assert series is not None and series.count == rows
    assert series.recent()[-1].step == (1 << 63) - 1 and series.last.value == 7.0
