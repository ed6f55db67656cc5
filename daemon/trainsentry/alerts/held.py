"""The outbox's rows and row updates that the state disk could not take, kept in memory.

While the state dir is full, a new alert must still reach the receivers that
are up: so an outbox row that cannot be inserted is held here, and the
delivery workers take it from here as they take rows from the table. What
happens to it (sent, postponed, given up) is recorded on the held row; what
happens to a row of the table whose update cannot be written is recorded as
an override. Once the disk takes writes again, `Outbox.flush_held` writes it
all in one transaction: the sent rows among them keep deduplicating a
re-read, as rows sent normally do.

Held rows are lost if the daemon stops before that; the points they came
from are then read again from the last saved offsets, and the alerts are
re-derived and sent again (at-least-once, as after a crash).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class HeldRow:
    key: str
    receiver: str
    run: str
    severity: str
    payload: dict[str, Any]
    created: float
    due: float
    attempts: int = 0
    last_error: str | None = None
    sent: float | None = None
    failed: float | None = None

    @property
    def waiting(self) -> bool:
        return self.sent is None and self.failed is None

    def as_row(self) -> tuple[Any, ...]:
        return (
            self.key, self.receiver, self.run, self.severity, self.payload, self.created,
            self.due, self.attempts, self.last_error, self.sent, self.failed,
        )  # fmt: skip


@dataclass(slots=True)
class Override:
    """An update of a table row not yet written: it was sent, given up, or postponed."""

    sent: float | None = None
    failed: float | None = None
    due: float | None = None
    attempts: int = 0
    last_error: str | None = None

    def hides(self, now: float) -> bool:
        """The table row is not to be taken now."""
        return (
            self.sent is not None
            or self.failed is not None
            or (self.due is not None and self.due > now)
        )


class Held:
    """What the outbox owes the disk. Not thread-safe: the outbox's lock guards it."""

    def __init__(self) -> None:
        self.rows: dict[str, HeldRow] = {}
        self.overrides: dict[str, Override] = {}
        self.deliveries: list[tuple[str, float, int]] = []

    def __bool__(self) -> bool:
        return bool(self.rows or self.overrides or self.deliveries)

    def clear(self) -> None:
        self.rows.clear()
        self.overrides.clear()
        self.deliveries.clear()

    def add(self, row: HeldRow) -> bool:
        if row.key in self.rows:
            return False
        self.rows[row.key] = row
        return True

    def waiting(self, receiver: str) -> list[HeldRow]:
        rows = (r for r in self.rows.values() if r.receiver == receiver and r.waiting)
        return sorted(rows, key=lambda r: (r.due, r.created, r.key))

    def sent(self, keys: list[str], now: float) -> list[str]:
        """Mark held rows sent; the keys left are rows of the table."""
        return self._apply(keys, lambda r: setattr(r, "sent", now))

    def postponed(self, keys: list[str], due: float, error: str) -> list[str]:
        def postpone(r: HeldRow) -> None:
            r.due, r.attempts, r.last_error = due, r.attempts + 1, error

        return self._apply(keys, postpone)

    def deferred(self, keys: list[str], due: float) -> list[str]:
        return self._apply(keys, lambda r: setattr(r, "due", due))

    def given_up(self, keys: list[str], error: str, now: float) -> list[str]:
        def give_up(r: HeldRow) -> None:
            r.failed, r.attempts, r.last_error = now, r.attempts + 1, error

        return self._apply(keys, give_up)

    def override(self, key: str) -> Override:
        found = self.overrides.get(key)
        if found is None:
            found = self.overrides[key] = Override()
        return found

    def _apply(self, keys: list[str], change: Any) -> list[str]:
        rest = []
        for k in keys:
            row = self.rows.get(k)
            if row is None:
                rest.append(k)
            else:
                change(row)
        return rest
