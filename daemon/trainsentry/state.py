"""The daemon's memory across restarts: one SQLite file in the state dir.

SQLite rather than a JSON checkpoint file: offsets of thousands of files are
updated every second, alert states and the notification outbox (later) need
transactions with them, and a WAL-mode commit is atomic and cheap.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS offsets (
    path TEXT PRIMARY KEY,
    dev INTEGER NOT NULL,
    ino INTEGER NOT NULL,
    fingerprint BLOB NOT NULL,
    behind BLOB NOT NULL,
    offset INTEGER NOT NULL,
    decoder_state TEXT NOT NULL,
    updated REAL NOT NULL
);
"""


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


class StateDB:
    def __init__(self, path: Path | str) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def load_offsets(self) -> dict[str, Checkpoint]:
        rows = self._db.execute(
            "SELECT path, dev, ino, fingerprint, offset, behind, decoder_state FROM offsets"
        ).fetchall()
        return {
            r[0]: Checkpoint(r[0], r[1], r[2], bytes(r[3]), r[4], bytes(r[5]), json.loads(r[6]))
            for r in rows
        }

    def save_offsets(self, checkpoints: Iterable[Checkpoint]) -> None:
        """One transaction for a whole read cycle: all or nothing after a crash."""
        now = time.time()
        rows = [
            (
                c.path,
                c.dev,
                c.ino,
                c.fingerprint,
                c.offset,
                c.behind,
                json.dumps(c.decoder_state),
                now,
            )
            for c in checkpoints
        ]
        if not rows:
            return
        with self._transaction():
            self._db.executemany(
                "INSERT INTO offsets"
                " (path, dev, ino, fingerprint, offset, behind, decoder_state, updated)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT(path) DO UPDATE SET dev=excluded.dev, ino=excluded.ino,"
                " fingerprint=excluded.fingerprint, offset=excluded.offset, behind=excluded.behind,"
                " decoder_state=excluded.decoder_state, updated=excluded.updated",
                rows,
            )

    def forget_offsets(self, paths: Iterable[str]) -> None:
        with self._transaction():
            self._db.executemany("DELETE FROM offsets WHERE path = ?", [(p,) for p in paths])

    def close(self) -> None:
        self._db.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._db.execute("ROLLBACK" if exc_type else "COMMIT")
