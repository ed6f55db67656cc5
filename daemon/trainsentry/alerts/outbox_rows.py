"""The outbox's rows, the changes a delivery makes to them, and what a full disk holds back.

A row is one notification for one receiver. Every change a delivery worker
makes (sent, retried later, held back, given up) is a `Change`, applied one
way wherever the row is: by one SQL statement to a row of the table, in
place to a row held in memory, or merged into the pending change of a table
row whose update the disk could not take. So the outbox has one write path,
and a full disk is a place a change waits, not a second set of methods.

While the state dir is full a new alert must still reach the receivers that
are up: an outbox row that cannot be inserted is held here, and the workers
take it from here as they take rows from the table. Once the disk takes
writes again, everything held is written in one transaction: the sent rows
among them keep deduplicating a re-read, as rows sent normally do. Held rows
are lost if the daemon stops before that; the points they came from are then
read again from the last saved offsets, and the alerts are re-derived and
sent again (at-least-once, as after a crash).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field

from trainsentry.alert import Notice

COLUMNS = "key, receiver, run, severity, payload, created, due, attempts, last_error, sent, failed"
INSERT = f"INSERT OR IGNORE INTO outbox ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
# One statement for every change: a field the change leaves alone is NULL here and
# coalesces to what the row has. A send clears the last error, and the mark a command
# action gets before it runs (dispatch.py: at most once).
UPDATE = (
    "UPDATE outbox SET sent = coalesce(?, sent),"
    " failed = CASE WHEN ? IS NOT NULL THEN NULL ELSE coalesce(?, failed) END,"
    " due = coalesce(?, due), attempts = attempts + ?,"
    " last_error = CASE WHEN ? IS NOT NULL THEN NULL ELSE coalesce(?, last_error) END"
    " WHERE key = ?"
)
SELECT = f"SELECT {COLUMNS} FROM outbox"


@dataclass(slots=True)
class Change:
    """What a delivery did to rows: the fields it sets, and attempts it adds."""

    sent: float | None = None
    failed: float | None = None
    due: float | None = None
    attempts: int = 0
    last_error: str | None = None

    def then(self, later: Change) -> None:
        """Fold a later change into this one (a table row's changes, held back)."""
        self.sent = later.sent if later.sent is not None else self.sent
        if later.sent is not None:
            self.failed = None
        elif later.failed is not None:
            self.failed = later.failed
        self.due = later.due if later.due is not None else self.due
        self.attempts += later.attempts
        if later.sent is not None:
            self.last_error = None
        elif later.last_error is not None:
            self.last_error = later.last_error

    def hides(self, now: float) -> bool:
        """The table row it waits for is not to be taken now."""
        return (
            self.sent is not None
            or self.failed is not None
            or (self.due is not None and self.due > now)
        )

    @property
    def ends(self) -> bool:
        """The row is done with: sent or given up."""
        return self.sent is not None or self.failed is not None

    def params(self, key: str) -> tuple[object, ...]:
        return (
            self.sent, self.sent, self.failed, self.due, self.attempts, self.sent,
            self.last_error, key,
        )  # fmt: skip


@dataclass(slots=True)
class OutboxRow:
    """One notification for one receiver, as the table holds it (or memory, when full)."""

    key: str  # idempotency key: the transition (or repeat, or action) × the receiver
    receiver: str
    run: str
    severity: str
    notice: Notice
    created: float
    due: float
    attempts: int = 0
    last_error: str | None = None
    sent: float | None = None
    failed: float | None = None

    @property
    def waiting(self) -> bool:
        return self.sent is None and self.failed is None

    def apply(self, change: Change) -> None:
        if change.sent is not None:
            self.sent, self.last_error, self.failed = change.sent, None, None
        elif change.last_error is not None:
            self.last_error = change.last_error
        if change.failed is not None:
            self.failed = change.failed
        if change.due is not None:
            self.due = change.due
        self.attempts += change.attempts

    def params(self) -> tuple[object, ...]:
        return (
            self.key, self.receiver, self.run, self.severity, self.notice.to_json(), self.created,
            self.due, self.attempts, self.last_error, self.sent, self.failed,
        )  # fmt: skip

    @classmethod
    def of(cls, r: sqlite3.Row | tuple[object, ...]) -> OutboxRow:
        """A row as SELECT read it."""
        key, receiver, run, severity, payload, created, due, attempts, error, sent, failed = r
        return cls(
            str(key), str(receiver), str(run), str(severity), Notice.from_json(str(payload)),
            float(created), float(due), int(attempts), error, sent, failed,  # type: ignore[arg-type]
        )  # fmt: skip


@dataclass(slots=True)
class Held:
    """What the outbox owes the disk. Not thread-safe: the outbox's lock guards it."""

    rows: dict[str, OutboxRow] = field(default_factory=dict)  # not inserted yet
    changes: dict[str, Change] = field(default_factory=dict)  # of table rows, not written yet
    deliveries: list[tuple[str, float, int]] = field(default_factory=list)  # the sent log's

    def __bool__(self) -> bool:
        return bool(self.rows or self.changes or self.deliveries)

    def clear(self) -> None:
        self.rows.clear()
        self.changes.clear()
        self.deliveries.clear()

    def add(self, row: OutboxRow) -> bool:
        if row.key in self.rows:
            return False
        self.rows[row.key] = row
        return True

    def apply(self, keys: Iterable[str], change: Change) -> list[str]:
        """Apply `change` to the held rows among `keys`; the keys left are rows of the table."""
        rest = []
        for k in keys:
            row = self.rows.get(k)
            if row is None:
                rest.append(k)
            else:
                row.apply(change)
        return rest

    def defer(self, keys: Iterable[str], change: Change) -> None:
        """Table rows whose update the disk refused: the change waits for the next write."""
        for k in keys:
            held = self.changes.get(k)
            if held is None:
                self.changes[k] = held = Change()
            held.then(change)

    def waiting(self, receiver: str) -> list[OutboxRow]:
        rows = (r for r in self.rows.values() if r.receiver == receiver and r.waiting)
        return sorted(rows, key=lambda r: (r.due, r.created, r.key))

    def write(self, db: sqlite3.Connection) -> None:
        """Everything held, in the caller's transaction."""
        db.executemany(INSERT, [r.params() for r in self.rows.values()])
        db.executemany(UPDATE, [c.params(k) for k, c in self.changes.items()])
        db.executemany(
            "INSERT INTO deliveries (receiver, sent, notifications) VALUES (?, ?, ?)",
            self.deliveries,
        )
