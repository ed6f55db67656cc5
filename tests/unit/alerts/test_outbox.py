"""The outbox: written before sending, confirmed once, retried with backoff, kept on restart."""

from __future__ import annotations

from pathlib import Path

from support.clock import Clock
from support.notify_harness import T0, Harness, RecordingSink, transition

from trainsentry.alert import Notice
from trainsentry.alerts.dispatch import Lane
from trainsentry.alerts.outbox import Entry, Outbox
from trainsentry.alerts.route import Route
from trainsentry.sinks.base import SendResult

ROUTE = Route("apprise", "json://127.0.0.1:1/hook", group_wait=0.0)


def entry(key: str, run: str = "r", due: float = T0) -> Entry:
    return Entry(key, ROUTE.receiver, run, "critical", Notice(transition(), "firing", T0), due)


def test_the_same_notification_written_twice_is_one_row(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "state.db", clock=Clock(T0))
    assert outbox.enqueue([entry("k1"), entry("k2")]) == 2
    assert outbox.enqueue([entry("k1")]) == 0
    assert outbox.counts() == {"queued": 2, "sent": 0, "failed": 0}


def test_a_confirmed_notification_is_never_sent_again_even_after_reopening(tmp_path: Path) -> None:
    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    sink = RecordingSink()
    lane = Lane(ROUTE, sink, outbox, clock=clock)
    outbox.enqueue([entry("k1")])
    lane.step(clock.now)
    assert len(sink.messages) == 1
    outbox.close()
    reopened = Outbox(tmp_path / "state.db", clock=clock)
    assert reopened.enqueue([entry("k1")]) == 0  # re-derived after a crash: ignored
    assert Lane(ROUTE, sink, reopened, clock=clock).step(clock.now) is None
    assert len(sink.messages) == 1


def test_a_retryable_failure_keeps_the_rows_and_backs_off(tmp_path: Path) -> None:
    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    sink = RecordingSink(results=[SendResult.retry("503"), SendResult.retry("503")])
    lane = Lane(ROUTE, sink, outbox, clock=clock, rng=lambda: 1.0)
    outbox.enqueue([entry("k1")])
    lane.step(clock.now)
    assert outbox.next_due(ROUTE.receiver) == T0 + 1.0
    assert lane.step(clock.now) == T0 + 1.0  # not due yet: nothing sent
    clock.now += 1.0
    lane.step(clock.now)
    assert outbox.next_due(ROUTE.receiver) == T0 + 1.0 + 2.0
    clock.now += 2.0
    lane.step(clock.now)
    assert len(sink.messages) == 3
    assert outbox.counts() == {"queued": 0, "sent": 1, "failed": 0}


def test_a_failure_that_will_not_change_is_given_up_at_once(tmp_path: Path) -> None:
    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    sink = RecordingSink(results=[SendResult.fatal("HTTP 404")])
    outbox.enqueue([entry("k1")])
    Lane(ROUTE, sink, outbox, clock=clock).step(clock.now)
    assert outbox.counts() == {"queued": 0, "sent": 0, "failed": 1}


def test_a_sink_that_raises_is_retried_not_fatal_to_the_worker(tmp_path: Path) -> None:
    class Broken(RecordingSink):
        def send(self, message: object) -> SendResult:
            raise RuntimeError("plugin bug")

    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    outbox.enqueue([entry("k1")])
    Lane(ROUTE, Broken(), outbox, clock=clock).step(clock.now)
    assert outbox.counts()["queued"] == 1


def test_unsent_notifications_go_out_from_a_new_notifier_after_a_restart(tmp_path: Path) -> None:
    first = Harness(tmp_path, ROUTE)
    first.sink().results = [SendResult.retry("down")]
    first.notifier.submit([transition(severity="critical")])
    first.deliver()
    first.outbox.close()
    second = Harness(tmp_path, ROUTE)
    second.clock.now += 3600
    second.deliver()
    [message] = second.sink().messages
    assert message.alerts[0].alert.rule == "loss_spike"


def test_one_receiver_down_does_not_hold_the_others(tmp_path: Path) -> None:
    down = Route("apprise", "json://127.0.0.1:1/down", group_wait=0.0)
    up = Route("apprise", "json://127.0.0.1:1/up", group_wait=0.0)
    h = Harness(tmp_path, down, up)
    h.sink(0).results = [SendResult.retry("down")] * 100
    h.notifier.submit([transition(severity="critical")])
    h.deliver()
    assert len(h.sink(1).messages) == 1
    assert h.outbox.counts()["queued"] == 1
