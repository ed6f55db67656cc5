"""The daemon's memory across restarts: one SQLite file in the state dir.

SQLite rather than a JSON checkpoint file: offsets of thousands of files are
updated every couple of seconds, the notification outbox needs transactions of its own,
and a WAL-mode commit is atomic and cheap. The outbox is written by the main
loop and by the delivery workers through their own connections (alerts/outbox.py);
WAL lets them read while another writes, and a busy timeout queues the writers.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)

CHECKPOINT_COLUMNS = """
    path TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    fingerprint BLOB NOT NULL,
    behind BLOB NOT NULL,
    offset INTEGER NOT NULL,
    decoder_state TEXT NOT NULL,
    updated REAL NOT NULL
"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS offsets ({CHECKPOINT_COLUMNS});
-- One row per notification (a transition, or a repeat, for one receiver), written
-- before it is sent. `key` is the idempotency key: a transition re-derived after a
-- crash maps to the same row, so a confirmed one (`sent` set) is never sent again.
-- Receivers are named by a hash of their URL: secrets never reach the disk here.
CREATE TABLE IF NOT EXISTS outbox (
    key TEXT PRIMARY KEY,
    receiver TEXT NOT NULL,
    run TEXT NOT NULL,
    severity TEXT NOT NULL,
    payload TEXT NOT NULL,
    created REAL NOT NULL,
    due REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    sent REAL,
    failed REAL
);
CREATE INDEX IF NOT EXISTS outbox_pending ON outbox (receiver, run)
    WHERE sent IS NULL AND failed IS NULL;
-- The sent log: one row per message delivered, so rate limits hold across restarts.
CREATE TABLE IF NOT EXISTS deliveries (
    receiver TEXT NOT NULL,
    sent REAL NOT NULL,
    notifications INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_by_receiver ON deliveries (receiver, sent);
-- Earlier versions kept the alert state here, a blob and its offsets: it is a file of
-- its own now (runtime/restart.py).
DROP TABLE IF EXISTS snapshot;
DROP TABLE IF EXISTS snapshot_offsets;
"""

BUSY_TIMEOUT_SECONDS = 30.0


def connect(path: Path | str) -> sqlite3.Connection:
    """A connection in autocommit mode on the state file, tables created.

    Each thread that writes (the main loop, every delivery worker) has its own:
    one connection shared between threads would interleave their transactions.
    """
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(
        str(path), isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_SECONDS
    )
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    return db


@dataclass(slots=True)
class Checkpoint:
    """Where reading of one file stopped, and how to recognise that file again."""

    path: str
    dev: int
    ino: int
    fingerprint: bytes
    offset: int
    behind: bytes = b""  # the bytes just before `offset`: a rewrite shifts them
    decoder_state: dict[str, Any] = field(default_factory=dict)

    def same_file(self, other: Checkpoint) -> bool:
        """Both taken of one file (an earlier and a later position of it)."""
        n = min(len(self.fingerprint), len(other.fingerprint))
        return (self.dev, self.ino) == (other.dev, other.ino) and (
            self.fingerprint[:n] == other.fingerprint[:n]
        )


_COLUMNS = "path, dev, ino, fingerprint, offset, behind, decoder_state"


class StateDB:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path) if str(path) != ":memory:" else None
        self.directory = self.path.parent if self.path is not None else None
        self._db = connect(path)

    def load_offsets(self) -> dict[str, Checkpoint]:
        return self._load_checkpoints("offsets")

    def save_offsets(self, checkpoints: Iterable[Checkpoint]) -> None:
        """One transaction for a whole read cycle: all or nothing after a crash."""
        rows = _rows(checkpoints)
        if not rows:
            return
        with self._transaction():
            self._upsert("offsets", rows)

    def _load_checkpoints(self, table: str) -> dict[str, Checkpoint]:
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM {table}").fetchall()
        return {
            r[0]: Checkpoint(r[0], r[1], r[2], bytes(r[3]), r[4], bytes(r[5]), json.loads(r[6]))
            for r in rows
        }

    def _upsert(self, table: str, rows: list[tuple[object, ...]]) -> None:
        self._db.executemany(
            f"INSERT INTO {table} ({_COLUMNS}, updated) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(path) DO UPDATE SET dev=excluded.dev, ino=excluded.ino,"
            " fingerprint=excluded.fingerprint, offset=excluded.offset, behind=excluded.behind,"
            " decoder_state=excluded.decoder_state, updated=excluded.updated",
            rows,
        )

    def forget_offsets(self, paths: Iterable[str]) -> None:
        keys = [(p,) for p in paths]
        with self._transaction():
            self._db.executemany("DELETE FROM offsets WHERE path = ?", keys)

    def close(self) -> None:
        self._db.close()

    def _transaction(self) -> Transaction:
        return Transaction(self._db)


def _rows(checkpoints: Iterable[Checkpoint]) -> list[tuple[object, ...]]:
    """orjson for the decoder states: a thousand files' offsets are saved every 2 s,
    and json.dumps was a third of it (decoder states hold only str keys, no floats)."""
    now = time.time()
    return [
        (c.path, c.dev, c.ino, c.fingerprint, c.offset, c.behind, _dumps(c.decoder_state), now)
        for c in checkpoints
    ]


def _dumps(state: dict[str, Any]) -> str:
    try:
        return orjson.dumps(state).decode()
    except TypeError:  # what orjson does not write (a non-str key, a huge int): json does
        return json.dumps(state)


class Transaction:
    """BEGIN IMMEDIATE ... COMMIT (or ROLLBACK on error): the write lock is taken up front."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        if not exc_type:
            self._db.execute("COMMIT")
        elif self._db.in_transaction:  # SQLITE_FULL mid-statement has rolled it back already
            self._db.execute("ROLLBACK")
