"""The alert line and the notice read back exactly what they wrote, NaN and all."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsentry.alert import Command, Notice, Transition

text = st.text(max_size=20)
number = st.floats(allow_nan=True, allow_infinity=True)
maybe = st.none() | st.floats(allow_nan=False, allow_infinity=False)
transitions = st.builds(
    Transition,
    run=text,
    rule=text,
    severity=st.sampled_from(["warning", "critical"]),
    state=st.sampled_from(["firing", "resolved"]),
    step=st.integers(-(2**63), 2**63 - 1),
    wall_time=number,
    metric=text,
    value=number,
    message=text,
    canonical=text,
    family=text,
    reason=st.none() | text,
    escalated_from=st.none() | st.just("warning"),
    runbook=st.none() | text,
    labels=st.dictionaries(text, text, max_size=3),
)
notices = st.builds(
    Notice,
    alert=transitions,
    kind=st.sampled_from(["firing", "repeat", "resolved", "action"]),
    at=st.floats(allow_nan=False, allow_infinity=False),
    since=maybe,
    threshold=maybe,
    link=st.none() | text,
    incident=st.none() | text,
    first_step=st.none() | st.integers(0, 10**9),
    first_wall=maybe,
    actions=st.lists(text, max_size=2).map(tuple),
    reason=st.none() | text,
    duration=maybe,
    peak=st.none() | number,
    peak_step=st.none() | st.integers(0, 10**9),
    run_dir=st.none() | text,
    command=st.none()
    | st.builds(
        Command, st.lists(text, min_size=1).map(tuple), maybe.filter(lambda x: x is not None)
    ),
)


def same(a: object, b: object) -> bool:
    """Equal, where NaN equals NaN (the evidence is often NaN)."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or a == b
    if hasattr(a, "__slots__") and type(a) is type(b):
        return all(same(getattr(a, f), getattr(b, f)) for f in a.__slots__)  # type: ignore[attr-defined]
    return a == b


@given(transitions)
def test_an_alert_line_reads_back_as_the_transition_it_was(t: Transition) -> None:
    line = json.loads(json.dumps(t.as_dict(), allow_nan=False))  # strict JSON, as documented
    back = Transition.from_dict(line)
    if not math.isfinite(t.wall_time):  # the line has no time for it: null
        assert math.isnan(back.wall_time)
        t = Transition(**{**{f: getattr(t, f) for f in t.__slots__}, "wall_time": math.nan})
    assert same(back, t)


@given(notices)
def test_a_notice_reads_back_from_the_outbox_as_it_was_written(n: Notice) -> None:
    back = Notice.from_json(n.to_json())
    if not math.isfinite(n.alert.wall_time):
        assert math.isnan(back.alert.wall_time)
        return
    assert same(back, n)


@pytest.mark.parametrize(
    "line",
    [
        {},
        {"run": "r", "rule": "x", "severity": "page", "state": "firing", "step": 1, "metric": "m"},
        {"run": "r", "rule": "x", "severity": "warning", "state": "gone", "step": 1, "metric": "m"},
    ],
)
def test_what_is_not_an_alert_line_is_refused(line: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        Transition.from_dict(line)
