"""Grouping, repeats, resolves and rate limits, on a fake clock: nothing here sleeps."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from support.notify_harness import T0, Harness, transition

from trainsentry.alerts.grouping import backoff, rate_allowed_at
from trainsentry.alerts.route import GROUP_INTERVAL_SECONDS, GROUP_WAIT_SECONDS, Route
from trainsentry.jobs import same_job
from trainsentry.point import Point
from trainsentry.store import Store


def test_warnings_wait_for_the_group_and_leave_as_one_message(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.submit([transition(rule="loss_spike")])
    h.deliver()
    assert h.sink().messages == []
    h.advance(10)
    h.notifier.submit([transition(rule="loss_plateau", step=110)])
    h.advance(19)
    assert h.sink().messages == []
    h.advance(1)
    [message] = h.sink().messages
    assert len(message.alerts) == 2
    assert message.title.startswith("[WARNING] exp1/seed0: 2 alerts (2 firing)")
    assert "loss_spike" in message.body and "loss_plateau" in message.body


def test_a_critical_goes_at_once_and_takes_the_waiting_warnings_of_its_run(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.submit([transition(rule="loss_spike")])
    h.notifier.submit([transition(rule="loss_nan", severity="critical", step=101)])
    h.deliver()
    [message] = h.sink().messages
    assert message.severity == "critical"
    assert [a.alert.rule for a in message.alerts] == ["loss_spike", "loss_nan"]


def test_other_runs_are_not_batched_together(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.submit(
        [transition(run="a", severity="critical"), transition(run="b", severity="critical")]
    )
    h.deliver()
    assert sorted(m.alerts[0].alert.run for m in h.sink().messages) == ["a", "b"]


def test_still_firing_is_repeated_after_the_repeat_interval(tmp_path: Path) -> None:
    route = Route("apprise", "json://127.0.0.1:1/a", repeat_interval=3600.0)
    h = Harness(tmp_path, route)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    h.advance(3599)
    assert len(h.sink().messages) == 1
    h.advance(1)
    assert len(h.sink().messages) == 2
    repeat = h.sink().messages[1]
    assert "still firing" in repeat.title
    assert "firing for 1h" in repeat.body
    h.advance(3600)
    assert len(h.sink().messages) == 3


def test_a_resolve_says_how_long_it_fired_its_peak_and_why(tmp_path: Path) -> None:
    store = Store()
    for step, value in [(100, 9.5), (101, 40.0), (102, 12.0), (103, 1.0)]:
        store.add(Point("exp1/seed0", "train/loss", step, T0 + (step - 100) * 60.0, value))
    h = Harness(tmp_path, store=store)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    h.clock.now += 180
    h.notifier.submit(
        [
            transition(
                "resolved", "critical", step=103, wall_time=T0 + 180, value=1.0, reason="recovered"
            )
        ]
    )
    h.advance(GROUP_INTERVAL_SECONDS)  # told once it has stayed recovered
    resolved = h.sink().messages[-1]
    assert resolved.severity == "resolved"
    assert resolved.title == "[RESOLVED] exp1/seed0: loss_spike resolved (recovered)"
    assert "was firing for 3m" in resolved.body
    assert "peak 40 at step 101" in resolved.body


def test_a_resolve_states_no_peak_when_the_store_misses_the_start_of_the_firing(
    tmp_path: Path,
) -> None:
    """After a restart the store holds only the points since the snapshot."""
    store = Store()
    for step, value in [(102, 12.0), (103, 1.0)]:  # the peak at 101 was before the restart
        store.add(Point("exp1/seed0", "train/loss", step, T0 + (step - 100) * 60.0, value))
    h = Harness(tmp_path, store=store)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    h.notifier.submit(
        [transition("resolved", "critical", step=103, wall_time=T0 + 180, reason="recovered")]
    )
    h.advance(GROUP_INTERVAL_SECONDS)
    resolved = h.sink().messages[-1]
    assert resolved.severity == "resolved" and "peak" not in resolved.body


@pytest.mark.parametrize("reason", ["recovered", "settled at a new level, ×2 the old (2 → 4)"])
def test_a_flapping_alert_is_one_alert_paged_once_and_resolved_once(
    tmp_path: Path, reason: str
) -> None:
    """Resolved by its data (back, or settled elsewhere) and firing again a minute later,
    six times: the same alert."""
    h = Harness(tmp_path)
    for i in range(6):
        h.notifier.submit([transition(severity="critical", step=100 + 2 * i)])
        h.advance(30)
        h.notifier.submit([transition("resolved", "critical", step=101 + 2 * i, reason=reason)])
        h.advance(30)
    assert [m.severity for m in h.sink().messages] == ["critical"]
    h.advance(GROUP_INTERVAL_SECONDS)  # it stayed recovered: now it is told
    assert [m.severity for m in h.sink().messages] == ["critical", "resolved"]
    assert "step 111" in h.sink().messages[-1].body  # the last resolve, not the first


def test_a_route_without_a_group_interval_is_told_the_resolve_and_the_re_fire(
    tmp_path: Path,
) -> None:
    """Alertmanager groups by itself: it gets every transition, the pager is damped."""
    pager = Route("apprise", "json://127.0.0.1:1/pager")
    direct = Route("apprise", "json://127.0.0.1:1/direct", group_interval=0.0)
    h = Harness(tmp_path, pager, direct)
    h.notifier.submit([transition(severity="critical", step=100)])
    h.deliver()
    h.notifier.submit([transition("resolved", "critical", step=101, reason="recovered")])
    h.deliver()
    h.notifier.submit([transition(severity="critical", step=102)])
    h.deliver()
    assert [m.severity for m in h.sink(0).messages] == ["critical"]
    assert [m.severity for m in h.sink(1).messages] == ["critical", "resolved", "critical"]
    h.notifier.submit([transition("resolved", "critical", step=103, reason="recovered")])
    h.advance(GROUP_INTERVAL_SECONDS)
    assert [m.severity for m in h.sink(0).messages] == ["critical", "resolved"]
    assert [m.severity for m in h.sink(1).messages][-1] == "resolved"


def test_a_resolve_that_is_not_a_recovery_is_told_at_once(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    h.notifier.submit([transition("resolved", "critical", step=101, reason="run finished")])
    h.deliver()
    assert [m.severity for m in h.sink().messages] == ["critical", "resolved"]


def test_one_page_per_run_per_incident_later_criticals_join_it(tmp_path: Path) -> None:
    """A learning-rate fault trips the step loss, the epoch loss and each layer's norm:
    one page, then one update naming the rest, not a page each."""
    h = Harness(tmp_path)
    h.notifier.submit([transition(severity="critical", rule="loss_divergence")])
    h.deliver()
    for i, rule in enumerate(("grad_norm_far_above_baseline", "loss_runaway", "loss_spike")):
        h.advance(20)
        h.notifier.submit([transition(severity="critical", rule=rule, step=110 + i)])
    h.advance(20)
    assert [m.alerts[0].alert.rule for m in h.sink().messages] == ["loss_divergence"]
    h.advance(GROUP_INTERVAL_SECONDS)
    pages = h.sink().messages
    assert len(pages) == 2 and [a.alert.rule for a in pages[1].alerts] == [
        "grad_norm_far_above_baseline", "loss_runaway", "loss_spike",
    ]  # fmt: skip
    other = transition(severity="critical", run="exp2/seed0")  # another run: its own page
    h.notifier.submit([other])
    h.deliver()
    assert len(h.sink().messages) == 3


def test_an_alert_that_fires_as_another_of_its_run_recovers_joins_that_incident(
    tmp_path: Path,
) -> None:
    """A loss back under the critical's line but still above the warning's: one point
    resolves the critical "recovered" and fires the warning. The person was paged for
    that run and it has not recovered: an update, not a new notification."""
    h = Harness(tmp_path)
    h.notifier.submit([transition(severity="critical", rule="loss_level_shift", step=1650)])
    h.deliver()
    h.advance(3600)
    h.notifier.submit(
        [
            transition("resolved", "critical", rule="loss_level_shift", step=2850,
                       reason="recovered"),
            transition(severity="warning", rule="loss_level_raised", step=2850),
        ]
    )  # fmt: skip
    h.advance(GROUP_INTERVAL_SECONDS)
    first, update = h.sink().messages  # the warning and the held resolve leave together
    assert first.severity == "critical"
    assert update.title.startswith("[WARNING] exp1/seed0: update to the incident of")
    assert "- joins the incident opened by loss_level_shift at step 1650" in update.body
    assert [(a.alert.rule, a.alert.state) for a in update.alerts] == [
        ("loss_level_raised", "firing"), ("loss_level_shift", "resolved"),
    ]  # fmt: skip
    h.notifier.submit([transition("resolved", "warning", rule="loss_level_raised", step=3000)])
    h.advance(GROUP_INTERVAL_SECONDS)
    h.notifier.submit([transition(severity="critical", rule="loss_divergence", step=4000)])
    h.deliver()
    assert "update" not in h.sink().messages[-1].title  # all told resolved: a new page


def test_a_job_logged_twice_is_one_incident_its_siblings_are_not(tmp_path: Path) -> None:
    """Keras with both callbacks: CSVLogger's run is the job's directory, TensorBoard's
    its `logs/` below; one NaN trips loss_non_finite in both."""
    h = Harness(tmp_path)
    h.notifier.submit([transition(severity="critical", rule="loss_non_finite", run="job/logs")])
    h.deliver()
    h.notifier.submit([transition(severity="critical", rule="loss_non_finite", run="job")])
    h.deliver()
    assert len(h.sink().messages) == 1  # the CSV run's alert joins, as an update later
    h.advance(GROUP_INTERVAL_SECONDS)
    assert [m.alerts[0].alert.run for m in h.sink().messages] == ["job/logs", "job"]
    update = h.sink().messages[1]
    assert update.title.startswith("[CRITICAL] job: update to the incident of loss_non_finite")
    assert "- joins the incident opened by loss_non_finite at step" in update.body
    assert "update" not in h.sink().messages[0].title
    for sibling in ("job2", "jobs/logs"):  # a name that merely starts alike is another job
        h.notifier.submit([transition(severity="critical", rule="loss_non_finite", run=sibling)])
        h.deliver()
    assert len(h.sink().messages) == 4


def test_same_job_is_a_run_and_the_runs_below_it() -> None:
    assert same_job("a/b", "a/b") and same_job("a/b", "a/b/logs") and same_job("a/b/c/d", "a/b")
    assert not same_job("a/b", "a/bc") and not same_job("a/b", "a/c") and not same_job("a", "b")


def test_a_critical_after_warnings_of_its_run_is_the_page(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.submit([transition(severity="warning", rule="loss_plateau")])
    h.advance(GROUP_WAIT_SECONDS)
    h.notifier.submit([transition(severity="critical", rule="loss_divergence", step=150)])
    h.deliver()
    assert [m.severity for m in h.sink().messages] == ["warning", "critical"]


def test_history_older_than_the_horizon_tells_no_one(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.since = T0
    h.notifier.submit([transition(severity="critical", wall_time=T0 - 10)])
    h.notifier.submit([transition("resolved", "critical", wall_time=T0 + 1)])
    h.deliver()
    assert h.sink().messages == []
    assert h.outbox.counts()["queued"] == 0


def test_a_critical_only_route_gets_no_warnings_and_the_escalation(tmp_path: Path) -> None:
    everything = Route("apprise", "json://127.0.0.1:1/all", group_wait=0.0)
    pages = Route("apprise", "json://127.0.0.1:1/pages", min_severity="critical")
    h = Harness(tmp_path, everything, pages)
    h.notifier.submit([transition()])
    h.notifier.submit([transition(severity="critical", escalated_from="warning", step=120)])
    h.notifier.submit([transition("resolved", "critical", step=130)])
    h.deliver()
    assert [len(m.alerts) for m in h.sink(0).messages] == [3]
    assert [a.alert.state for a in h.sink(1).messages[0].alerts] == ["firing", "resolved"]
    assert "escalated from warning" in h.sink(1).messages[0].body


def test_a_link_from_the_template_is_in_the_message(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.notifier.link_template = "http://tb:6006/#scalars&regexInput={run}"
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    assert "(http://tb:6006/#scalars&regexInput=exp1%2Fseed0)" in h.sink().messages[0].body


def test_rate_limit_and_backoff_arithmetic() -> None:
    route = Route("apprise", "x://", rate_limit=(3, 60.0))
    assert rate_allowed_at(route, [0.0, 10.0], 20.0) == 20.0
    assert rate_allowed_at(route, [0.0, 10.0, 15.0], 20.0) == 60.0
    assert rate_allowed_at(route, [0.0, 10.0, 15.0], 61.0) == 61.0
    assert [backoff(a, lambda: 1.0) for a in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert backoff(3, lambda: 0.0) == 4.0  # jitter: half to all of the step
    assert backoff(40, lambda: 1.0) == 300.0
    assert math.isfinite(backoff(10_000))


@pytest.mark.parametrize("severity", ["warning", "critical"])
def test_a_fire_and_resolve_inside_the_group_wait_say_both(tmp_path: Path, severity: str) -> None:
    h = Harness(tmp_path)
    h.notifier.submit([transition(severity=severity), transition("resolved", severity, step=101)])
    h.advance(30)
    states = [a.alert.state for m in h.sink().messages for a in m.alerts]
    assert states == ["firing", "resolved"]
    assert "- firing for" not in h.sink().messages[0].body
