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
workers; every operation is a short statement or transaction.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainsentry.state import Transaction, connect

KEEP_SENT_SECONDS = 7 * 86400.0  # confirmed rows kept this long (dedup across restarts)


@dataclass(frozen=True, slots=True)
class Entry:
    """A notification to write: what, for whom, and not before when."""

    key: str
    receiver: str
    run: str
    severity: str
    payload: dict[str, Any]
    due: float


@dataclass(frozen=True, slots=True)
class Pending:
    key: str
    receiver: str
    run: str
    severity: str
    payload: dict[str, Any]
    created: float
    due: float
    attempts: int


class Outbox:
    def __init__(self, path: Path | str, *, clock: Callable[[], float] = time.time) -> None:
        self._db = connect(path)
        self._lock = threading.Lock()
        self._clock = clock
        self.prune()

    # -- the main loop's side -------------------------------------------------

    def enqueue(self, entries: Sequence[Entry]) -> int:
        """Write entries in one transaction; returns how many were new (not seen before)."""
        if not entries:
            return 0
        now = self._clock()
        rows = [
            (e.key, e.receiver, e.run, e.severity, json.dumps(e.payload), now, e.due)
            for e in entries
        ]
        with self._lock, Transaction(self._db):
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO outbox (key, receiver, run, severity, payload, created, due)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return self._db.total_changes - before

    def known(self, key: str) -> bool:
        with self._lock:
            row = self._db.execute("SELECT 1 FROM outbox WHERE key = ?", (key,)).fetchone()
        return row is not None

    # -- the delivery workers' side ------------------------------------------

    def next_due(self, receiver: str) -> float | None:
        with self._lock:
            row = self._db.execute(
                "SELECT min(due) FROM outbox"
                " WHERE receiver = ? AND sent IS NULL AND failed IS NULL",
                (receiver,),
            ).fetchone()
        return None if row[0] is None else float(row[0])

    def take(self, receiver: str, now: float, *, batch: bool, limit: int = 50) -> list[Pending]:
        """The next message's rows: the run whose earliest row is due first, if it is due.

        With `batch`, every waiting row of that run goes along, due or not: a
        critical carries the warnings that were waiting for their group_wait,
        and rows held back by backoff or a rate limit leave together.
        """
        with self._lock:
            head = self._db.execute(
                "SELECT run, key FROM outbox WHERE receiver = ? AND sent IS NULL"
                " AND failed IS NULL AND due <= ? ORDER BY due, created, key LIMIT 1",
                (receiver, now),
            ).fetchone()
            if head is None:
                return []
            if batch:
                rows = self._db.execute(
                    "SELECT key, receiver, run, severity, payload, created, due, attempts"
                    " FROM outbox WHERE receiver = ? AND run = ? AND sent IS NULL"
                    " AND failed IS NULL ORDER BY created, rowid LIMIT ?",
                    (receiver, head[0], limit),
                ).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT key, receiver, run, severity, payload, created, due, attempts"
                    " FROM outbox WHERE key = ?",
                    (head[1],),
                ).fetchall()
        return [Pending(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6], r[7]) for r in rows]

    def confirm(self, receiver: str, keys: Iterable[str], now: float) -> None:
        """Mark rows sent and log the delivery, in one transaction."""
        keys = list(keys)
        with self._lock, Transaction(self._db):
            self._db.executemany(
                "UPDATE outbox SET sent = ?, last_error = NULL WHERE key = ?",
                [(now, k) for k in keys],
            )
            self._db.execute(
                "INSERT INTO deliveries (receiver, sent, notifications) VALUES (?, ?, ?)",
                (receiver, now, len(keys)),
            )

    def postpone(self, keys: Iterable[str], due: float, error: str) -> None:
        with self._lock, Transaction(self._db):
            self._db.executemany(
                "UPDATE outbox SET due = ?, attempts = attempts + 1, last_error = ? WHERE key = ?",
                [(due, error, k) for k in keys],
            )

    def defer(self, keys: Iterable[str], due: float) -> None:
        """Not before `due`, and no attempt counted: held back on purpose, not failed."""
        with self._lock, Transaction(self._db):
            self._db.executemany(
                "UPDATE outbox SET due = ? WHERE key = ?", [(due, k) for k in keys]
            )

    def give_up(self, keys: Iterable[str], error: str, now: float) -> None:
        with self._lock, Transaction(self._db):
            self._db.executemany(
                "UPDATE outbox SET failed = ?, attempts = attempts + 1, last_error = ?"
                " WHERE key = ?",
                [(now, error, k) for k in keys],
            )

    def deliveries_since(self, receiver: str, since: float) -> list[float]:
        with self._lock:
            rows = self._db.execute(
                "SELECT sent FROM deliveries WHERE receiver = ? AND sent > ? ORDER BY sent",
                (receiver, since),
            ).fetchall()
        return [r[0] for r in rows]

    # -- looking in -----------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Rows by state: queued, sent, failed (for status output and tests)."""
        with self._lock:
            row = self._db.execute(
                "SELECT count(*) FILTER (WHERE sent IS NULL AND failed IS NULL),"
                " count(sent), count(failed) FROM outbox"
            ).fetchone()
        return {"queued": row[0], "sent": row[1], "failed": row[2]}

    def waiting_receivers(self) -> set[str]:
        with self._lock:
            rows = self._db.execute(
                "SELECT DISTINCT receiver FROM outbox WHERE sent IS NULL AND failed IS NULL"
            ).fetchall()
        return {r[0] for r in rows}

    def prune(self) -> None:
        """Forget confirmed rows after a week: long enough that no re-read can re-derive them."""
        cutoff = self._clock() - KEEP_SENT_SECONDS
        with self._lock, Transaction(self._db):
            self._db.execute("DELETE FROM outbox WHERE coalesce(sent, failed) < ?", (cutoff,))
            self._db.execute("DELETE FROM deliveries WHERE sent < ?", (cutoff,))

    def close(self) -> None:
        with self._lock:
            self._db.close()
