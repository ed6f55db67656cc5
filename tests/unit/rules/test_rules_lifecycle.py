"""The alert state machine: Prometheus' `for` / `keep_firing_for` on the data's own axis."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from trainsentry.rules.lifecycle import (
    BECAME_PENDING,
    CANCELLED,
    ESCALATED,
    FIRED,
    RESOLVED,
    Lifecycle,
)
from trainsentry.rules.model import ACTIVE, CRITICAL, QUIET, Span


def drive(machine: Lifecycle, verdicts: str, every: int = 10, seconds: float = 1.0) -> list:
    """Verdicts as characters at steps 0, every, ...: . quiet, w active, c critical, ? none."""
    codes = {".": QUIET, "w": ACTIVE, "c": CRITICAL, "?": None}
    events = []
    for i, ch in enumerate(verdicts):
        event = machine.observe(codes[ch], i * every, 1000.0 + i * every * seconds)
        if event is not None:
            events.append((event, i * every))
    return events


def test_without_for_an_active_verdict_fires_at_once_and_a_quiet_one_resolves() -> None:
    assert drive(Lifecycle(), "..ww.") == [(FIRED, 20), (RESOLVED, 40)]


def test_for_in_steps_holds_the_alert_pending_until_the_condition_held_that_long() -> None:
    machine = Lifecycle(for_=Span(30, "steps"))
    assert drive(machine, ".wwwww.") == [(BECAME_PENDING, 10), (FIRED, 40), (RESOLVED, 60)]


def test_a_pending_alert_that_clears_is_cancelled_and_never_fires() -> None:
    machine = Lifecycle(for_=Span(30, "steps"))
    assert drive(machine, "ww.ww.") == [
        (BECAME_PENDING, 0),
        (CANCELLED, 20),
        (BECAME_PENDING, 30),
        (CANCELLED, 50),
    ]


def test_for_in_points_counts_consecutive_active_verdicts() -> None:
    machine = Lifecycle(for_=Span(3, "points"))
    assert drive(machine, "www") == [(BECAME_PENDING, 0), (FIRED, 20)]


def test_for_in_seconds_uses_the_runs_wall_time_not_the_step() -> None:
    machine = Lifecycle(for_=Span(60, "seconds"))
    # 10 steps per point at 2 s per step: 20 s per point, so 60 s is reached on the 4th
    assert drive(machine, "wwww", seconds=2.0) == [(BECAME_PENDING, 0), (FIRED, 30)]


def test_keep_firing_for_bridges_short_gaps_in_the_condition() -> None:
    machine = Lifecycle(keep_firing_for=Span(30, "steps"))
    assert drive(machine, "w..w...") == [(FIRED, 0), (RESOLVED, 60)]


def test_keep_firing_for_in_points_counts_quiet_verdicts() -> None:
    machine = Lifecycle(keep_firing_for=Span(2, "points"))
    assert drive(machine, "w.w..") == [(FIRED, 0), (RESOLVED, 40)]


def test_for_with_and_points_waits_for_that_many_points_past_the_span() -> None:
    # points 500 steps apart: one point stands for 500 steps, which is 100, but one point
    machine = Lifecycle(for_=Span(100, "steps", min_points=2))
    assert drive(machine, ".w.ww", every=500) == [
        (BECAME_PENDING, 500),
        (CANCELLED, 1000),
        (BECAME_PENDING, 1500),
        (FIRED, 2000),
    ]
    # every step logged: the span is what waits
    machine = Lifecycle(for_=Span(5, "steps", min_points=2))
    assert drive(machine, "w" * 7, every=1)[-1] == (FIRED, 5)


def test_keep_firing_for_with_and_points_needs_both_quiet() -> None:
    machine = Lifecycle(keep_firing_for=Span(30, "steps", min_points=5))
    # 30 steps of quiet come after 3 points, the 5 points after 50 steps
    assert drive(machine, "w......") == [(FIRED, 0), (RESOLVED, 50)]


def test_escalation_to_critical_is_the_same_alert_with_one_event() -> None:
    machine = Lifecycle()
    assert drive(machine, "wwcw.") == [(FIRED, 0), (ESCALATED, 20), (RESOLVED, 40)]
    assert machine.level == QUIET


def test_severity_does_not_step_down_while_the_alert_lives() -> None:
    machine = Lifecycle()
    drive(machine, "wcw")
    assert machine.firing and machine.level == CRITICAL


def test_escalation_while_pending_fires_as_critical() -> None:
    machine = Lifecycle(for_=Span(2, "points"))
    assert drive(machine, "wc") == [(BECAME_PENDING, 0), (FIRED, 10)]
    assert machine.level == CRITICAL


def test_no_verdict_changes_nothing() -> None:
    machine = Lifecycle(for_=Span(2, "points"))
    assert drive(machine, "w??w") == [(BECAME_PENDING, 0), (FIRED, 30)]


def test_stop_ends_a_firing_alert_and_reports_that_it_was_firing() -> None:
    machine = Lifecycle()
    drive(machine, "w")
    assert machine.stop() is True
    assert machine.stop() is False
    assert drive(machine, "w") == [(FIRED, 0)]


@given(st.text(alphabet=".wc?", max_size=60), st.integers(0, 4), st.integers(0, 4))
def test_events_alternate_fired_then_resolved_whatever_the_verdicts(
    verdicts: str, hold: int, keep: int
) -> None:
    machine = Lifecycle(for_=Span(hold, "points"), keep_firing_for=Span(keep, "points"))
    firing = False
    for event, _ in drive(machine, verdicts):
        if event == FIRED:
            assert not firing
            firing = True
        elif event in (RESOLVED,):
            assert firing
            firing = False
        elif event == ESCALATED:
            assert firing
    assert firing == machine.firing
