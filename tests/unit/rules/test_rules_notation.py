"""The series notation of rule tests (`trainsentry.rules.notation`), and the points read from it.

`values("0 1 2 nan _ 5")` is six slots: numbers, `nan`/`inf`/`-inf`, and `_`
for "nothing logged at this step". `a+bxn` expands to n+1 values a, a+b, ...
(promtool's notation), `a-bxn` counts down, `axn` repeats a n+1 times and
`a*rxn` is geometric (a, a·r, a·r², ...) — the shape of a diverging gradient
norm.
"""

from __future__ import annotations

import math

import pytest
from support.series import points

from trainsentry.rules.notation import NotationError, samples, slots, values


def test_numbers_nan_and_gaps_are_read_in_order() -> None:
    got = values("0 1.5 nan _ -inf 5")
    assert got[:2] == [0.0, 1.5] and math.isnan(got[2] or 0.0)
    assert got[3] is None and got[4] == -math.inf and got[5] == 5.0


def test_promtool_expansions_give_n_plus_one_values() -> None:
    assert values("1+1x3") == [1.0, 2.0, 3.0, 4.0]
    assert values("10-2x2") == [10.0, 8.0, 6.0]
    assert values("7x2") == [7.0, 7.0, 7.0]
    assert values("1*2x3") == [1.0, 2.0, 4.0, 8.0]
    assert values("_x2 1") == [None, None, 1.0]


def test_points_skip_gaps_but_keep_the_step_axis() -> None:
    got = points("1 _ 3", every=10, start=100)
    assert [(p.step, p.value) for p in got] == [(100, 1.0), (120, 3.0)]
    assert got[1].wall_time - got[0].wall_time == 20.0


def test_a_step_prefix_places_a_term_and_later_slots_follow_it() -> None:
    got = slots("1 100:5 6 200:nan", interval=10)
    assert [(s.step, s.value) for s in got][:3] == [(0, 1.0), (100, 5.0), (110, 6.0)]
    assert got[3].step == 200 and math.isnan(got[3].value or 0.0)
    assert samples("1000:1*2x2", interval=5) == [(1000, 1.0), (1005, 2.0), (1010, 4.0)]


def test_a_group_repeats_like_a_single_value_n_plus_one_times() -> None:
    assert values("(1 2)x2") == [1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    assert values("(0 (5)x1)x1 _") == [0.0, 5.0, 5.0, 0.0, 5.0, 5.0, None]


def test_scientific_notation_works_inside_expansions() -> None:
    assert values("1e-3-1e-4x2") == pytest.approx([1e-3, 9e-4, 8e-4])
    assert values("1e3*1e-1x1 NaN -inf")[:2] == [1000.0, 100.0]


@pytest.mark.parametrize(
    ("spec", "offset", "words"),
    [
        ("1 2 3x", 4, "cannot read `3x`"),
        ("1 1+1", 2, "needs a count"),
        ("0 _+1x3", 2, "a gap `_` takes no"),
        ("1 (2 3", 2, "closing `)`"),
        ("(1 5:2)x3", 3, "no `STEP:` inside"),
    ],
)
def test_a_bad_token_is_reported_with_its_offset(spec: str, offset: int, words: str) -> None:
    with pytest.raises(NotationError) as caught:
        values(spec)
    assert caught.value.offset == offset and words in str(caught.value)
