"""Pushing to Alertmanager's v2 API: labels, annotations, startsAt/endsAt, re-sends, resolves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from support.notify_endpoints import HttpReceiver
from support.notify_harness import Harness, transition

from trainsentry.alert import Notice
from trainsentry.alerts.route import parse_alertmanager
from trainsentry.sinks.alertmanager import AlertmanagerSink
from trainsentry.sinks.base import Message


@pytest.fixture
def am() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    receiver.close()


def harness(tmp: Path, am: HttpReceiver) -> Harness:
    route = parse_alertmanager(f"http://{am.url}/")
    h = Harness(tmp, route)
    h.notifier.lanes[route.receiver].sink = AlertmanagerSink(route.url, route.timeout, h.clock)
    return h


def ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_a_firing_alert_is_posted_with_labels_annotations_and_validity(
    tmp_path: Path, am: HttpReceiver
) -> None:
    h = harness(tmp_path, am)
    t = transition(
        severity="critical", family="loss", labels={"team": "vision"}, runbook="Lower the LR."
    )
    h.notifier.submit([t])
    h.deliver()
    [request] = am.requests
    assert request.path == "/api/v2/alerts"
    assert request.headers["Content-Type"] == "application/json"
    [alert] = request.json()
    assert alert["labels"] == {
        "alertname": "loss_spike",
        "run": "exp1/seed0",
        "job": "exp1/seed0",
        "severity": "critical",
        "rule": "loss_spike",
        "metric": "train/loss",
        "family": "loss",
        "team": "vision",
    }
    assert alert["annotations"]["summary"] == t.message
    assert alert["annotations"]["runbook"] == "Lower the LR."
    assert "9.5" in alert["annotations"]["description"]
    assert ts(alert["startsAt"]) == pytest.approx(h.clock.now)
    assert ts(alert["endsAt"]) == pytest.approx(h.clock.now + 240)


def test_a_shorter_resend_interval_re_sends_sooner_valid_for_four_of_them(
    tmp_path: Path, am: HttpReceiver
) -> None:
    route = parse_alertmanager(f"http://{am.url}/", resend=15.0)
    h = Harness(tmp_path, route)
    sink = AlertmanagerSink(route.url, route.timeout, h.clock, resend=route.repeat_interval)
    h.notifier.lanes[route.receiver].sink = sink
    start = h.clock.now
    h.notifier.submit([transition()])
    h.deliver()
    h.advance(15)
    assert len(am.requests) == 2
    assert ts(am.requests[1].json()[0]["endsAt"]) == pytest.approx(start + 15 + 60)


def test_a_firing_alert_is_re_sent_every_minute_and_its_resolve_ends_it(
    tmp_path: Path, am: HttpReceiver
) -> None:
    h = harness(tmp_path, am)
    start = h.clock.now
    h.notifier.submit([transition()])  # warnings too: Alertmanager groups by itself
    h.deliver()
    h.advance(60)
    h.advance(60)
    assert len(am.requests) == 3
    resent = am.requests[2].json()[0]
    assert ts(resent["startsAt"]) == pytest.approx(start)
    assert ts(resent["endsAt"]) == pytest.approx(start + 120 + 240)
    h.advance(10)
    h.notifier.submit([transition("resolved", step=140, reason="run finished")])
    h.deliver()
    resolved = am.requests[3].json()[0]
    assert resolved["labels"] == am.requests[0].json()[0]["labels"]
    assert ts(resolved["endsAt"]) == pytest.approx(start + 130)
    h.advance(60)
    assert len(am.requests) == 4  # nothing more once resolved


def test_an_escalation_ends_the_warning_label_set(tmp_path: Path, am: HttpReceiver) -> None:
    h = harness(tmp_path, am)
    h.notifier.submit([transition()])
    h.deliver()
    h.advance(5)
    h.notifier.submit([transition(severity="critical", escalated_from="warning", step=120)])
    h.deliver()
    alerts = {a["labels"]["severity"]: a for a in am.requests[-1].json()}
    assert ts(alerts["warning"]["endsAt"]) == pytest.approx(h.clock.now)
    assert ts(alerts["critical"]["endsAt"]) > h.clock.now


@pytest.mark.parametrize(("status", "retryable"), [(500, True), (503, True), (400, False)])
def test_refusals_say_whether_to_retry(am: HttpReceiver, status: int, retryable: bool) -> None:
    am.status = status
    notice = Notice(transition(), "firing", 0.0, since=0.0)
    result = AlertmanagerSink(f"http://{am.url}", 5.0).send(
        Message("t", "b", "warning", alerts=(notice,))
    )
    assert (result.ok, result.retryable) == (False, retryable)


def test_an_alertmanager_that_is_down_is_retried_and_gets_everything_when_up(
    tmp_path: Path,
) -> None:
    from support.ports import free_port

    port = free_port()
    route = parse_alertmanager(f"http://127.0.0.1:{port}")
    h = Harness(tmp_path, route)
    h.notifier.lanes[route.receiver].sink = AlertmanagerSink(route.url, 2.0, h.clock)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    assert h.outbox.counts()["queued"] == 1
    am = HttpReceiver(port=port)
    try:
        h.advance(600)
        assert len(am.requests) >= 1
        assert h.outbox.counts()["queued"] == 0
    finally:
        am.close()


def test_a_firing_and_its_resolve_queued_in_an_outage_both_reach_alertmanager_in_order(
    tmp_path: Path,
) -> None:
    """Sent together, the resolve would win and Alertmanager would never page.

    So the firing goes first, and the resolve a minute after it, past
    Alertmanager's group_wait (30 s by default).
    """
    from support.ports import free_port

    port = free_port()
    route = parse_alertmanager(f"http://127.0.0.1:{port}")
    h = Harness(tmp_path, route)
    h.notifier.lanes[route.receiver].sink = AlertmanagerSink(route.url, 2.0, h.clock)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()  # refused: Alertmanager is down
    h.clock.now += 5
    h.notifier.submit([transition("resolved", severity="critical", step=140, reason="recovered")])
    h.deliver()
    am = HttpReceiver(port=port)
    try:
        h.advance(600)  # back up: the retry takes both rows of the run
        assert [a["endsAt"] > a["startsAt"] for r in am.requests for a in r.json()] == [True]
        [firing] = am.requests[0].json()
        assert ts(firing["endsAt"]) > h.clock.now  # firing, valid for minutes
        sent_at = h.clock.now
        h.advance(30)
        assert len(am.requests) == 1  # the resolve waits: Alertmanager is still grouping
        h.advance(31)
        [resolved] = am.requests[-1].json()
        assert resolved["labels"] == firing["labels"]
        assert ts(resolved["endsAt"]) < sent_at  # it ended when it did, before the outage ended
        assert h.outbox.counts() == {"queued": 0, "sent": 2, "failed": 0}
    finally:
        am.close()


def test_a_resolve_held_for_alertmanager_is_not_overtaken_by_a_new_firing(
    tmp_path: Path, am: HttpReceiver
) -> None:
    h = harness(tmp_path, am)
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    h.advance(2)
    h.notifier.submit([transition("resolved", severity="critical", step=140, reason="recovered")])
    h.deliver()
    h.advance(5)
    h.notifier.submit([transition(severity="critical", step=150)])  # fires again
    h.deliver()
    assert len(am.requests) == 1  # both wait behind the held resolve
    h.advance(60)
    last = am.requests[-1].json()
    assert ts(last[-1]["endsAt"]) > h.clock.now  # it ends firing, as the run is


def test_a_ranks_alert_carries_its_job_and_rank_for_alertmanager_to_group_by(
    tmp_path: Path, am: HttpReceiver
) -> None:
    h = harness(tmp_path, am)
    h.notifier.submit([transition(severity="critical", run="logs/llm7_k2j4h5g6/attempt_1/3")])
    h.deliver()
    [alert] = am.requests[0].json()
    labels = alert["labels"]
    assert (labels["job"], labels["rank"], labels["attempt"]) == ("logs/llm7", "3", "1")
