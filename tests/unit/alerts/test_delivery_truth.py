"""What is promised about delivery, exactly: at least once, repeats few and recognisable,
a command action at most once, and nothing given up in silence."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from support.clock import Clock
from support.notify_harness import T0, RecordingSink, transition

from trainsentry.alert import Command, Notice
from trainsentry.alerts.dispatch import STARTED, Lane
from trainsentry.alerts.outbox import Entry, Outbox
from trainsentry.alerts.route import Route
from trainsentry.sinks.base import AMBIGUOUS_TRIES, Message, SendResult, timeout_for
from trainsentry.sinks.masking import mask_url

ROUTE = Route("apprise", "json://127.0.0.1:1/hook", group_wait=0.0, rate_limit=None)
COMMAND = Route("command", "command", group_wait=0.0, rate_limit=None, batch=False)


def entry(key: str, route: Route = ROUTE, notice: Notice | None = None) -> Entry:
    return Entry(
        key, route.receiver, "r", "critical", notice or Notice(transition(), "firing", T0), T0
    )


def lane_for(tmp: Path, results: list[SendResult]) -> tuple[Lane, Outbox, RecordingSink, Clock]:
    """A lane to ROUTE with one notification queued and its sink answering `results`."""
    clock = Clock(T0)
    outbox = Outbox(tmp / "state.db", clock=clock)
    sink = RecordingSink(results=results)
    outbox.enqueue([entry("k1")])
    return Lane(ROUTE, sink, outbox, clock=clock, rng=lambda: 1.0), outbox, sink, clock


def run_down(lane: Lane, clock: Clock, rounds: int) -> None:
    for _ in range(rounds):
        nxt = lane.step(clock.now)
        if nxt is None:
            return
        clock.now = max(clock.now, nxt)


def test_sends_that_meet_no_answer_carry_one_key_wait_longer_and_stop(tmp_path: Path) -> None:
    lane, outbox, sink, clock = lane_for(tmp_path, [SendResult.unanswered("timed out")] * 10)
    run_down(lane, clock, 20)
    assert len(sink.messages) == AMBIGUOUS_TRIES
    assert len({m.key for m in sink.messages}) == 1 and sink.messages[0].key
    assert [m.attempt for m in sink.messages] == list(range(AMBIGUOUS_TRIES))
    assert all(m.body.endswith(f"`notification {m.key}`") for m in sink.messages)
    assert outbox.counts() == {"queued": 0, "sent": 0, "failed": 1}
    assert [timeout_for(10.0, m.attempt) for m in sink.messages] == [10, 20, 40, 80, 80]


def test_a_receiver_that_is_down_is_retried_without_end(tmp_path: Path) -> None:
    """Refused is not ambiguous: nothing arrived, so at least once means trying on."""
    lane, outbox, sink, clock = lane_for(tmp_path, [SendResult.retry("connection refused")] * 30)
    run_down(lane, clock, 60)  # a send, then a jump to its retry: two rounds a send
    assert len(sink.messages) == 30 and outbox.counts()["queued"] == 1


class Crashes(RecordingSink):
    def send(self, message: Message) -> SendResult:
        raise KeyboardInterrupt  # the process dies with the command running


def test_a_command_action_is_marked_done_before_it_runs_so_a_crash_never_reruns_it(
    tmp_path: Path,
) -> None:
    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    action = Notice(transition(), "action", T0, command=Command(("true",), 30.0))
    outbox.enqueue([entry("c1", COMMAND, action)])
    with pytest.raises(KeyboardInterrupt):
        Lane(COMMAND, Crashes(), outbox, clock=clock).step(clock.now)
    reopened = Outbox(tmp_path / "state.db", clock=clock)
    sink = RecordingSink()
    assert Lane(COMMAND, sink, reopened, clock=clock).step(clock.now) is None
    assert sink.messages == []
    db = sqlite3.connect(tmp_path / "state.db")
    assert db.execute("SELECT last_error FROM outbox").fetchone() == (STARTED,)


def test_a_command_action_that_ran_is_sent_not_failed(tmp_path: Path) -> None:
    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    action = Notice(transition(), "action", T0, command=Command(("true",), 30.0))
    outbox.enqueue([entry("c1", COMMAND, action)])
    Lane(COMMAND, RecordingSink(), outbox, clock=clock).step(clock.now)
    assert outbox.counts() == {"queued": 0, "sent": 1, "failed": 0}


def test_a_command_that_failed_is_never_retried(tmp_path: Path) -> None:
    clock = Clock(T0)
    outbox = Outbox(tmp_path / "state.db", clock=clock)
    action = Notice(transition(), "action", T0, command=Command(("true",), 30.0))
    outbox.enqueue([entry("c1", COMMAND, action)])
    sink = RecordingSink(results=[SendResult.retry("boom")])
    run_down(Lane(COMMAND, sink, outbox, clock=clock), clock, 5)
    assert len(sink.messages) == 1 and outbox.counts()["failed"] == 1


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("json://user:pw@host/hook/hooksecretpath", "json://user:****@host/****/****"),
        ("https://am.example.com/alertmanager/secretroute", "https://am.example.com/****/****"),
        ("mailtos://u:p@smtp.example.com?to=a@b", "mailtos://u:****@smtp.example.com?…"),
    ],
)
def test_a_webhooks_every_path_segment_is_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
