"""Delivery workers: one thread per receiver, draining that receiver's outbox rows.

Why one per receiver: an endpoint that is down or hangs must delay only its
own notifications. With one worker for all, a Slack outage would hold the
email and the Alertmanager pushes behind its timeouts. Within a receiver,
messages go one at a time, in order, so a resolve never overtakes its firing.
Neither runs on the main loop: reading and evaluating never wait for the
network.

A step is: respect the rate limit, take the next due batch, render, send,
record the outcome. The outcome follows the notifier contract: confirmed →
`sent`; retryable → back off (exponential, jittered) and keep; not
retryable → given up and logged. `step(now)` does no waiting itself, so
tests drive a worker with a fake clock, one step at a time.

Delivery is at least once: a send that met no answer in time (the receiver
may have taken it) is retried with a longer wait, each message carrying a
stable key receivers can drop repeats by; after AMBIGUOUS_TRIES unanswered
sends in a row it is given up and said loudly. A command action runs at most
once: its row is marked done before the command starts, so a crash during it
never runs it again.

A route may hold a resolve back until its firing has been delivered for a
while (`hold_resolve`): Alertmanager pages only after its group_wait, so a
firing and its resolve that arrive together, as after an outage, would
never page. The held resolve and whatever follows it for the same alert
wait together, so nothing overtakes it.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainsentry.alert import AlertKey
from trainsentry.alerts import message as text
from trainsentry.alerts.grouping import backoff, rate_allowed_at
from trainsentry.alerts.outbox import Outbox
from trainsentry.alerts.outbox_rows import OutboxRow
from trainsentry.alerts.route import Route
from trainsentry.sinks.base import AMBIGUOUS_TRIES, Message, SendResult, Sink
from trainsentry.sinks.forwarded_text import Marked

log = logging.getLogger(__name__)

IDLE_CHECK_SECONDS = 60.0  # a worker with nothing due still looks this often
# What a command action's row says while it runs, and ever after if the daemon stops then
STARTED = "started; the daemon stopped before its end was recorded (not run again)"


def render(rows: list[OutboxRow], attachments: bool, now: float) -> Message:
    """Rows of one run (oldest first) → one message; plots only where they can go."""
    notices = [r.notice for r in rows]
    files: list[Path] = []
    if attachments:
        from trainsentry.alerts.plot import plot_incident

        for n in notices:
            bundle = n.incident
            if bundle and not n.resolved:
                try:
                    png = plot_incident(Path(bundle))
                except Exception as exc:  # evidence is a bonus; the message still goes
                    log.warning("no plot for %s: %s", bundle, exc)
                    png = None
                if png is not None and png not in files:
                    files.append(png)
    key = hashlib.sha256("\x1f".join(r.key for r in rows).encode()).hexdigest()[:32]
    return Message(
        title=text.title(notices),
        body=Marked(text.body(notices, now), f"\n\n`notification {key}`"),
        severity=text.message_severity(notices),
        attachments=tuple(files),
        alerts=tuple(notices),
        key=key,
        attempt=max(r.attempts for r in rows),
    )


class Lane:
    def __init__(
        self,
        route: Route,
        sink: Sink,
        outbox: Outbox,
        *,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        on_result: Callable[[Route, list[OutboxRow], SendResult], object] | None = None,
    ) -> None:
        self.route = route
        self.sink = sink
        self.outbox = outbox
        self._clock = clock
        self._rng = rng
        self._on_result = on_result
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0  # messages given up (each said in the log, at ERROR)
        self._unanswered: dict[str, int] = {}  # row key → sends in a row met by no answer
        self._fired: dict[AlertKey, float] = {}  # alert → firing first delivered

    @property
    def receiver(self) -> str:
        return self.route.receiver

    def step(self, now: float) -> float | None:
        """Send at most one message if one is due; when to look next (None: nothing queued)."""
        period = self.route.rate_limit[1] if self.route.rate_limit else 0.0
        sent = self.outbox.deliveries_since(self.receiver, now - period) if period else []
        allowed = rate_allowed_at(self.route, sent, now)
        if allowed > now:
            return allowed
        rows = self._hold_resolves(
            self.outbox.take(self.receiver, now, batch=self.route.batch), now
        )
        if not rows:
            return self.outbox.next_due(self.receiver)
        keys = [r.key for r in rows]
        if self.route.kind == "command":  # at most once: done before it starts
            self.outbox.give_up(keys, STARTED, now)
        try:
            result = self.sink.send(render(rows, self.sink.takes_attachments, now))
        except Exception as exc:  # a sink bug must not end the worker; the rows wait
            log.exception("sending to %s failed", self.sink.name)
            result = SendResult.retry(f"{type(exc).__name__}: {exc}")
        done = self._clock()
        if result.retryable and self.route.kind == "command":
            result = SendResult.fatal(result.error)  # run once already: never again
        if result.ambiguous:
            tries = max(self._unanswered.get(k, 0) for k in keys) + 1
            for k in keys:
                self._unanswered[k] = tries
            if tries >= AMBIGUOUS_TRIES:
                result = SendResult.fatal(
                    f"{result.error}; no answer {tries} times in a row: it may have arrived, "
                    "and is not sent again"
                )
        for k in keys if not result.ambiguous else ():  # "in a row": anything else ends it
            self._unanswered.pop(k, None)
        if result.ok:
            self.outbox.confirm(self.receiver, keys, done)
            for r in rows:
                if r.notice.resolved:
                    self._fired.pop(r.notice.alert.key, None)
                else:
                    self._fired.setdefault(r.notice.alert.key, done)
            self.sent += 1
            log.info("sent %d notification(s) to %s", len(rows), self.sink.name)
        elif result.retryable:
            attempts = max(r.attempts for r in rows)
            wait = backoff(attempts, self._rng)
            self.outbox.postpone(keys, done + wait, result.error)
            log.warning(
                "%s: %s; %d notification(s) kept, retry %d in %.0fs",
                self.sink.name, result.error, len(rows), attempts + 1, wait,
            )  # fmt: skip
        else:
            self.outbox.give_up(keys, result.error, done)
            self.failed += 1
            log.error("%s: %s; %d notification(s) dropped", self.sink.name, result.error, len(rows))
        if self._on_result is not None:
            self._on_result(self.route, rows, result)
        return done

    def _hold_resolves(self, rows: list[OutboxRow], now: float) -> list[OutboxRow]:
        """The rows to send now; resolves too soon after their firing wait, and what follows."""
        hold = self.route.hold_resolve
        if hold <= 0 or not rows:
            return rows
        fired_here: set[AlertKey] = set()
        held: dict[AlertKey, float] = {}
        keep: list[OutboxRow] = []
        for r in rows:
            alert = r.notice.alert.key
            if alert in held:
                self.outbox.defer([r.key], held[alert])
                continue
            if not r.notice.resolved:
                fired_here.add(alert)
            else:
                fired = now if alert in fired_here else self._fired.get(alert)
                if fired is not None and now < fired + hold:
                    held[alert] = fired + hold
                    self.outbox.defer([r.key], held[alert])
                    continue
            keep.append(r)
        return keep

    # -- the thread -----------------------------------------------------------

    def start(self) -> None:
        name = f"trainsentry-deliver-{self.route.kind}"
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """New rows were written: look now."""
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                nxt = self.step(self._clock())
            except Exception:  # the state DB busy or full: keep the worker, try again later
                log.exception("delivery worker for %s", self.sink.name)
                nxt = self._clock() + 5.0
            if self._stop.is_set():
                break
            wait = IDLE_CHECK_SECONDS if nxt is None else nxt - self._clock()
            if wait > 0:
                self._wake.wait(min(wait, IDLE_CHECK_SECONDS))
