"""The outbox: every notification is a row in the state database before it is sent.

Why a table and not a queue in memory: a notification must survive a crash,
a `kill -9`, or an endpoint that is down for an hour. The main loop writes the
rows of a cycle's transitions in one transaction *before* the cycle's read
offsets are committed (runtime.py), so after a crash either the rows are there
or the points are read again and the same rows are derived again. Their key is
the transition's identity × the receiver, and inserting is `INSERT OR IGNORE`:
a re-derived notification that was already confirmed is not sent twice.

A row is confirmed (`sent`) only after its receiver accepted it. The window
between the receiver's answer and that commit is the one place a crash can
repeat a message: at-least-once, as every outbox is.

One connection guarded by a lock serves the main loop and the delivery
workers; every operation is a short statement or transaction. A write the
state disk cannot take (full) is held in memory and goes with the next write
that works (outbox_rows.py); reads keep working, so deliveries go on meanwhile.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainsentry.alert import Notice
from trainsentry.alerts.outbox_rows import SELECT, UPDATE, Change, Held, OutboxRow
from trainsentry.state.db import Transaction, connect
from trainsentry.state.disk_full import WriteTrouble, is_unwritable, rollback

KEEP_SENT_SECONDS = 7 * 86400.0  # confirmed rows kept this long (dedup across restarts)
_WAITING = "sent IS NULL AND failed IS NULL"


@dataclass(frozen=True, slots=True)
class Entry:
    """A notification to write: what, for whom, and not before when."""

    key: str
    receiver: str
    run: str
    severity: str
    notice: Notice
    due: float


class Outbox:
    def __init__(
        self,
        path: Path | str,
        *,
        clock: Callable[[], float] = time.time,
        trouble: WriteTrouble | None = None,
    ) -> None:
        self._db = connect(path)
        self._lock = threading.Lock()
        self._clock = clock
        self._trouble = trouble or WriteTrouble(Path(path))
        self._held = Held()
        self.prune()

    # -- the main loop's side -------------------------------------------------

    def enqueue(self, entries: Sequence[Entry]) -> int:
        """Write entries in one transaction; returns how many were new (not seen before)."""
        if not entries:
            return 0
        now = self._clock()
        rows = [
            OutboxRow(e.key, e.receiver, e.run, e.severity, e.notice, now, e.due) for e in entries
        ]
        new = 0

        def insert() -> None:
            nonlocal new
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO outbox (key, receiver, run, severity, payload, created, due)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [r.params()[:7] for r in rows],
            )
            new = self._db.total_changes - before

        with self._lock:
            if self._write(insert):
                return new
            known = self._known_keys([r.key for r in rows])
            return sum(self._held.add(r) for r in rows if r.key not in known)

    def flush_held(self) -> None:
        """Write what a full disk held back, if it takes writes again (once per loop cycle)."""
        with self._lock:
            if self._held:
                self._write(lambda: None)

    def known(self, key: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM outbox WHERE key = ?", (key,)).fetchone()
        return row is not None

    # -- the delivery workers' side ------------------------------------------

    def next_due(self, receiver: str) -> float | None:
        with self._lock:
            if self._held:
                dues = [due for _, _, due, _ in self._waiting_in_table(receiver)]
                dues += [r.due for r in self._held.waiting(receiver)]
                return min(dues) if dues else None
            row = self._db.execute(
                f"SELECT min(due) FROM outbox WHERE receiver = ? AND {_WAITING}", (receiver,)
            ).fetchone()
        return None if row[0] is None else float(row[0])

    def take(self, receiver: str, now: float, *, batch: bool, limit: int = 50) -> list[OutboxRow]:
        """The next message's rows: the run whose earliest row is due first, if it is due.

        With `batch`, every waiting row of that run goes along, due or not: a
        critical carries the warnings that were waiting for their group_wait,
        and rows held back by backoff or a rate limit leave together.
        """
        with self._lock:
            if self._held:
                return self._take_held(receiver, now, batch=batch, limit=limit)
            head = self._db.execute(
                f"SELECT run, key FROM outbox WHERE receiver = ? AND {_WAITING}"
                " AND due <= ? ORDER BY due, created, key LIMIT 1",
                (receiver, now),
            ).fetchone()
            if head is None:
                return []
            return self._rows(receiver, head[0], head[1], batch=batch, limit=limit)

    def confirm(self, receiver: str, keys: Iterable[str], now: float) -> None:
        """Mark rows sent and log the delivery, in one transaction."""
        keys = list(keys)
        self._change(keys, Change(sent=now), delivery=(receiver, now, len(keys)))

    def postpone(self, keys: Iterable[str], due: float, error: str) -> None:
        """A retryable failure: try again at `due`, one attempt counted."""
        self._change(keys, Change(due=due, attempts=1, last_error=error))

    def defer(self, keys: Iterable[str], due: float) -> None:
        """Not before `due`, and no attempt counted: held back on purpose, not failed."""
        self._change(keys, Change(due=due))

    def give_up(self, keys: Iterable[str], error: str, now: float) -> None:
        self._change(keys, Change(failed=now, attempts=1, last_error=error))

    def deliveries_since(self, receiver: str, since: float) -> list[float]:
        with self._lock:
            rows = self._db.execute(
                "SELECT sent FROM deliveries WHERE receiver = ? AND sent > ? ORDER BY sent",
                (receiver, since),
            ).fetchall()
            held = [t for r, t, _ in self._held.deliveries if r == receiver and t > since]
        return sorted([r[0] for r in rows] + held)

    # -- the one write path -----------------------------------------------------

    def _change(
        self, keys: Iterable[str], change: Change, delivery: tuple[str, float, int] | None = None
    ) -> None:
        """Apply `change` to rows wherever they are: held rows in memory, table rows by
        one UPDATE, or, when the disk refuses it, held for the next write that works."""
        with self._lock:
            table = self._held.apply(keys, change)

            def update() -> None:
                self._db.executemany(UPDATE, [change.params(k) for k in table])
                if delivery is not None:
                    self._db.execute(
                        "INSERT INTO deliveries (receiver, sent, notifications) VALUES (?, ?, ?)",
                        delivery,
                    )

            if not self._write(update):
                self._held.defer(table, change)
                if delivery is not None:
                    self._held.deliveries.append(delivery)

    def _write(self, work: Callable[[], object]) -> bool:
        """Run `work` in one transaction with whatever is held; False if the disk is full.

        Called with the lock held. Any other error is raised as before.
        """
        flushing = bool(self._held)
        try:
            with Transaction(self._db):
                if flushing:
                    self._held.write(self._db)
                work()
        except (sqlite3.OperationalError, OSError) as exc:
            if not is_unwritable(exc):
                raise
            rollback(self._db)
            self._trouble.failed(exc)
            return False
        if flushing:
            self._held.clear()
        self._trouble.worked()
        return True

    # -- reading, with what is held ---------------------------------------------

    def _known_keys(self, keys: list[str]) -> set[str]:
        marks = ",".join("?" * len(keys))
        rows = self._db.execute(f"SELECT key FROM outbox WHERE key IN ({marks})", keys)
        return {r[0] for r in rows}

    def _rows(
        self, receiver: str, run: str, key: str, *, batch: bool, limit: int
    ) -> list[OutboxRow]:
        if batch:
            rows = self._db.execute(
                f"{SELECT} WHERE receiver = ? AND run = ? AND {_WAITING}"
                " ORDER BY created, rowid LIMIT ?",
                (receiver, run, limit),
            ).fetchall()
        else:
            rows = self._db.execute(f"{SELECT} WHERE key = ?", (key,)).fetchall()
        return [OutboxRow.of(r) for r in rows]

    def _waiting_in_table(self, receiver: str) -> Iterator[tuple[str, str, float, float]]:
        """(run, key, due, created) of the table's waiting rows, with the held changes."""
        rows = self._db.execute(
            f"SELECT run, key, due, created FROM outbox WHERE receiver = ? AND {_WAITING}"
            " ORDER BY due, created, key",
            (receiver,),
        )
        for run, key, due, created in rows:
            c = self._held.changes.get(key)
            if c is not None and c.ends:
                continue
            yield run, key, (c.due if c is not None and c.due is not None else due), created

    def _take_held(self, receiver: str, now: float, *, batch: bool, limit: int) -> list[OutboxRow]:
        heads = [
            (due, created, key, run)
            for run, key, due, created in self._waiting_in_table(receiver)
            if due <= now
        ]
        heads += [
            (r.due, r.created, r.key, r.run) for r in self._held.waiting(receiver) if r.due <= now
        ]
        if not heads:
            return []
        _, _, key, run = min(heads)
        held = [r for r in self._held.waiting(receiver) if r.run == run and (batch or r.key == key)]
        table = (
            [] if not batch and held else self._rows(receiver, run, key, batch=batch, limit=limit)
        )
        rows = []
        for r in table:
            c = self._held.changes.get(r.key)
            if c is not None:
                if c.ends:
                    continue
                r.apply(c)
            rows.append(r)
        rows += held
        return sorted(rows, key=lambda r: r.created)[:limit]

    # -- looking in -----------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Rows by state: queued, sent, failed (for status output and tests)."""
        with self._lock:
            row = self._db.execute(
                f"SELECT count(*) FILTER (WHERE {_WAITING}), count(sent), count(failed) FROM outbox"
            ).fetchone()
            held = list(self._held.rows.values())
        return {
            "queued": row[0] + sum(r.waiting for r in held),
            "sent": row[1] + sum(r.sent is not None for r in held),
            "failed": row[2] + sum(r.failed is not None for r in held),
        }

    def waiting_receivers(self) -> set[str]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT DISTINCT receiver FROM outbox WHERE {_WAITING}"
            ).fetchall()
        return {r[0] for r in rows}

    def prune(self) -> None:
        """Forget confirmed rows after a week: long enough that no re-read can re-derive them."""
        cutoff = self._clock() - KEEP_SENT_SECONDS

        def delete() -> None:
            self._db.execute("DELETE FROM outbox WHERE coalesce(sent, failed) < ?", (cutoff,))
            self._db.execute("DELETE FROM deliveries WHERE sent < ?", (cutoff,))

        with self._lock:
            self._write(delete)

    def close(self) -> None:
        with self._lock:
            self._db.close()
