"""What a daemon's state.db says, read by a test from outside while it runs or after it died.

The end-to-end tests judge a crash or a full disk by what the daemon had made
durable: where reading of a file was committed, which notifications the outbox
marked as sent. A daemon killed early may have no file yet, or a file without
its tables; that reads as nothing committed, not as an error.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path


def committed_offset(state_db: Path, log: Path) -> int | None:
    """Where reading of `log` stood as the state in `state_db` committed it (None: nowhere yet)."""
    if not state_db.exists():  # killed before it made its state
        return None
    db = sqlite3.connect(state_db)
    try:
        found = db.execute("SELECT offset FROM offsets WHERE path = ?", (str(log),)).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return None
    finally:
        db.close()
    return int(found[0]) if found else None


def confirmed(state_db: Path) -> set[tuple[str, int]]:
    """(state, step) of each notification the outbox in `state_db` shows as sent."""
    if not state_db.exists():  # killed before it opened its state: nothing confirmed yet
        return set()
    db = sqlite3.connect(state_db)
    try:
        rows = db.execute("SELECT payload FROM outbox WHERE sent IS NOT NULL").fetchall()
    except sqlite3.OperationalError as exc:  # killed between creating the file and its tables
        if "no such table" not in str(exc):
            raise
        return set()
    finally:
        db.close()
    return {(p["alert"]["state"], p["alert"]["step"]) for p in (json.loads(r[0]) for r in rows)}
