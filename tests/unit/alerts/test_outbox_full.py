"""The outbox when the state DB cannot grow: rows held in memory, still delivered, saved later.

The full database is real: SQLite's own size limit (`PRAGMA max_page_count`
set to the pages the file has) makes every write that needs a page fail with
SQLITE_FULL, as a full disk does, without root or a small filesystem; raising
the limit is "space is back". tests/e2e/test_state_disk_full.py fills a real disk.
"""

from __future__ import annotations

import io
import sqlite3
from pathlib import Path

from support.clock import Clock
from support.notify_harness import T0, RecordingSink, transition

from trainsentry.alert import Notice, Transition
from trainsentry.alerts.dispatch import Lane
from trainsentry.alerts.outbox import Entry, Outbox
from trainsentry.alerts.route import Route
from trainsentry.sinks.base import SendResult
from trainsentry.state.disk_full import WriteTrouble

ROUTE = Route("apprise", "json://127.0.0.1:1/hook", group_wait=0.0, rate_limit=None)


def padded(alert: Transition) -> Notice:
    """A notice too large for the pages the full database has left."""
    return Notice(alert, "resolved" if alert.resolved else "firing", T0, link="x" * 20_000)


def entry(key: str, state: str = "firing", created_step: int = 100) -> Entry:
    alert = transition(state=state, step=created_step)
    return Entry(key, ROUTE.receiver, "r", "critical", padded(alert), T0)


def full(outbox: Outbox, full: bool = True) -> None:
    db: sqlite3.Connection = outbox._db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages if full else 1 << 30}")


def rows(path: Path) -> dict[str, tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        got = db.execute("SELECT key, sent, failed, attempts FROM outbox").fetchall()
    finally:
        db.close()
    return {r[0]: r[1:] for r in got}


def test_rows_that_do_not_fit_are_delivered_from_memory_and_saved_when_room_is_back(
    tmp_path: Path,
) -> None:
    clock, said = Clock(T0), io.StringIO()
    outbox = Outbox(tmp_path / "state.db", clock=clock, trouble=WriteTrouble(tmp_path, out=said))
    sink = RecordingSink()
    lane = Lane(ROUTE, sink, outbox, clock=clock)
    full(outbox)
    assert outbox.enqueue([entry("k1")]) == 1
    assert outbox.enqueue([entry("k1")]) == 0  # held once, like a row
    assert rows(tmp_path / "state.db") == {}
    lane.step(clock.now)
    assert len(sink.messages) == 1  # delivered while nothing could be written
    assert lane.step(clock.now) is None  # and not again
    assert outbox.counts() == {"queued": 0, "sent": 1, "failed": 0}
    assert said.getvalue().count("cannot write the state") == 1

    full(outbox, False)
    outbox.flush_held()
    saved = rows(tmp_path / "state.db")
    assert list(saved) == ["k1"] and saved["k1"][0] is not None  # saved as sent
    assert outbox.enqueue([entry("k1")]) == 0  # a re-read after a restart is not sent again
    assert "can be written again" in said.getvalue()


def test_a_batch_mixes_saved_and_held_rows_in_order_and_their_retries_are_saved_later(
    tmp_path: Path,
) -> None:
    clock, said = Clock(T0), io.StringIO()
    outbox = Outbox(tmp_path / "state.db", clock=clock, trouble=WriteTrouble(tmp_path, out=said))
    sink = RecordingSink(results=[SendResult.retry("503")])
    lane = Lane(ROUTE, sink, outbox, clock=clock, rng=lambda: 1.0)
    outbox.enqueue([entry("fire")])  # saved while there was room
    full(outbox)
    clock.now += 0.5
    outbox.enqueue([entry("resolve", state="resolved", created_step=101)])  # held
    lane.step(clock.now)  # one message, the firing before its resolve; refused, kept
    assert [[a.alert.state for a in m.alerts] for m in sink.messages] == [["firing", "resolved"]]
    assert outbox.next_due(ROUTE.receiver) == clock.now + 1.0  # both backed off, in memory
    assert lane.step(clock.now) == clock.now + 1.0
    clock.now += 1.0
    lane.step(clock.now)
    assert len(sink.messages) == 2
    assert lane.step(clock.now) is None  # both sent: nothing left, from the table or memory

    full(outbox, False)
    outbox.flush_held()
    saved = rows(tmp_path / "state.db")
    assert saved["fire"][0] is not None and saved["fire"][2] == 1  # sent after one retry
    assert saved["resolve"][0] is not None and saved["resolve"][2] == 1
    assert said.getvalue().count("cannot write the state") == 1


def test_a_resolve_held_back_for_its_firing_waits_in_memory_while_the_disk_is_full(
    tmp_path: Path,
) -> None:
    """Held-back resolves (Alertmanager routes) are deferred like postponed rows: no busy loop."""
    clock = Clock(T0)
    outbox = Outbox(
        tmp_path / "state.db", clock=clock, trouble=WriteTrouble(tmp_path, out=io.StringIO())
    )
    route = Route("apprise", "json://127.0.0.1:1/hook", group_wait=0.0, rate_limit=None,
                  hold_resolve=60.0)  # fmt: skip
    sink = RecordingSink()
    lane = Lane(route, sink, outbox, clock=clock)
    full(outbox)
    # no room for either row: both are held in memory
    firing, resolve = padded(transition()), padded(transition(state="resolved", step=101))
    outbox.enqueue(
        [
            Entry(k, route.receiver, "r", "critical", p, T0)
            for k, p in (("f", firing), ("r", resolve))
        ]
    )
    assert rows(tmp_path / "state.db") == {}
    assert lane.step(clock.now) is not None
    assert [len(m.alerts) for m in sink.messages] == [1]  # the firing alone
    assert lane.step(clock.now) == T0 + 60.0  # the resolve waits its minute, not retaken
    assert len(sink.messages) == 1
    clock.now = T0 + 60.0
    lane.step(clock.now)
    assert [m.alerts[0].alert.state for m in sink.messages] == ["firing", "resolved"]
