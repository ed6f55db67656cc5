"""bench/rank_test.py: the oracle that says when a fault shows in the loss. Its exact
p-value is checked against counting every ordering, so the bench's "shown at" is the
test it says it is."""

from __future__ import annotations

import itertools
import math
import random
from types import ModuleType

import pytest
from support.paths import bench_module


def _rank_test() -> ModuleType:
    return bench_module("rank_test", "rank_test.py")


def _enumerated(after: list[float], before: list[float]) -> float:
    """The share of all splits of the pooled values whose U is at least the observed one."""
    rt = _rank_test()
    pooled = after + before
    observed = rt._u(after, before)
    hits = total = 0
    for chosen in itertools.combinations(range(len(pooled)), len(after)):
        rest = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        hits += rt._u([pooled[i] for i in chosen], rest) >= observed - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize("sizes", [(1, 4), (2, 5), (3, 6), (4, 4), (5, 3)])
def test_p_is_the_share_of_orderings_at_least_as_high(sizes: tuple[int, int]) -> None:
    rt = _rank_test()
    rng = random.Random(sum(sizes))
    for _ in range(5):
        after = [rng.random() for _ in range(sizes[0])]
        before = [rng.random() for _ in range(sizes[1])]
        assert rt.p_above(after, before) == pytest.approx(_enumerated(after, before))


def test_three_points_above_all_twenty_is_one_ordering_in_c_23_3() -> None:
    rt = _rank_test()
    p = rt.p_above([25.0, 26.0, 27.0], [float(v) for v in range(20)])
    assert p == pytest.approx(1 / math.comb(23, 3))
    assert p < rt.VISIBLE_P  # so 3 such points show a fault; 1 point never can (1/21)
    assert rt.p_above([math.nan], [float(v) for v in range(20)]) == pytest.approx(1 / 21)


def test_a_shift_shows_only_once_its_points_are_above_enough_of_the_spread() -> None:
    rt = _rank_test()
    before = [float(v % 10) for v in range(20)]  # 0..9 twice
    inside = [8.5, 7.5, 9.5]  # high, but inside the spread: p 0.013 after three
    assert rt.first_visible(inside, before) is None
    assert rt.first_visible([*inside, 20.0], before) == 4  # p 0.0025
    assert rt.first_visible([4.0] * 50, before) is None  # the old level never shows
