"""The daemon's memory across restarts: one SQLite file in the state dir.

SQLite rather than a JSON checkpoint file: offsets of thousands of files are
updated every couple of seconds, the notification outbox needs transactions of its own,
and a WAL-mode commit is atomic and cheap. The outbox is written by the main
loop and by the delivery workers through their own connections (alerts/outbox.py);
WAL lets them read while another writes, and a busy timeout queues the writers.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import pickle
import sqlite3
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

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
-- its own now (StateDB.save_snapshot).
DROP TABLE IF EXISTS snapshot;
DROP TABLE IF EXISTS snapshot_offsets;
"""

BUSY_TIMEOUT_SECONDS = 30.0
# The alert state (engine and firing book, see snapshot.py) as of one moment, and where
# reading each file stood at that moment: after a restart the state is restored and the
# points between these positions and `offsets` are read again, to relearn, not to tell.
SNAPSHOT_FILE = "alert-state.snapshot"
SNAPSHOT_FORMAT = 1


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


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Saved alert state and the read position of each file it has seen."""

    blob: bytes
    offsets: dict[str, Checkpoint]


_COLUMNS = "path, dev, ino, fingerprint, offset, behind, decoder_state"


class StateDB:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path) if str(path) != ":memory:" else None
        self.directory = self.path.parent if self.path is not None else None
        self._db = connect(path)
        self._snapshot_path = self.directory / SNAPSHOT_FILE if self.directory is not None else None
        self._in_memory: bytes | None = None  # the snapshot of a state DB in memory

    def load_offsets(self) -> dict[str, Checkpoint]:
        return self._load_checkpoints("offsets")

    def save_offsets(self, checkpoints: Iterable[Checkpoint]) -> None:
        """One transaction for a whole read cycle: all or nothing after a crash."""
        rows = _rows(checkpoints)
        if not rows:
            return
        with self._transaction():
            self._upsert("offsets", rows)

    def load_snapshot(self, digest: str) -> Snapshot | None:
        """The saved alert state, if one was saved by code of this `digest`; None if it
        is missing, of other code, or damaged (then everything is relearned)."""
        try:
            if self._snapshot_path is None:
                if self._in_memory is None:
                    return None
                source: BinaryIO = io.BytesIO(self._in_memory)
            else:
                source = open(self._snapshot_path, "rb")  # noqa: SIM115  # closed below
        except FileNotFoundError:
            return None
        except OSError as exc:  # unreadable: relearned, as a damaged one is
            log.warning("cannot read the saved alert state: %s; relearning from the logs", exc)
            return None
        with source:
            try:
                form, saved_by, rows = pickle.load(source)
                if form != SNAPSHOT_FORMAT or saved_by != digest:
                    return None
                offsets = {r[0]: Checkpoint(*r) for r in rows}
            except Exception:  # truncated or garbled: as if there were none
                return None
            return Snapshot(source.read(), offsets)

    def save_snapshot(
        self, digest: str, dump: Callable[[BinaryIO], None], positions: Iterable[Checkpoint]
    ) -> int:
        """Replace the snapshot: `dump` writes the state, saved with the read positions
        it goes with in one file beside state.db (written aside, then renamed over the
        old one, so one never outlives the other); its size.

        Not a blob in state.db: the state of 1,000 runs is ~17 MB, and copying it
        into SQLite's WAL (and from there into the database at the next
        checkpoint) took longer than pickling it (measured: 0.2-0.36 s against
        0.15 s), time the loop spent not reading. Not fsynced: after a power
        cut a lost snapshot means a relearn from the logs, the time of a backfill.
        """
        rows = [
            (c.path, c.dev, c.ino, c.fingerprint, c.offset, c.behind, c.decoder_state)
            for c in positions
        ]

        def write(out: BinaryIO) -> int:
            pickle.dump((SNAPSHOT_FORMAT, digest, rows), out, pickle.HIGHEST_PROTOCOL)
            dump(out)
            return out.tell()

        if self._snapshot_path is None:
            buffer = io.BytesIO()
            size = write(buffer)
            self._in_memory = buffer.getvalue()
            return size
        aside = self._snapshot_path.with_name(self._snapshot_path.name + ".new")
        try:
            with open(aside, "wb") as out:
                size = write(out)
            os.replace(aside, self._snapshot_path)
        except BaseException:
            with contextlib.suppress(OSError):
                aside.unlink()
            raise
        return size

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
