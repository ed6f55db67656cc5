"""A JSONL run whose loss jumps above a threshold at chosen steps, and what receivers got of it.

Shared by the tests that run the real daemon against a local receiver: one
critical rule, chunks written in one write each (the daemon reads a chunk in
one cycle), the (state, step) pairs a json:// message carried, and those the
outbox confirmed.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

from notify_endpoints import Request

RULES = """\
version: 1
rules:
  - name: loss_high
    metric: loss
    severity: critical
    threshold: {above: 10}
"""
STEP = re.compile(r"\(`loss`\) at step (\d+),")


def write_chunk(path: Path, steps: range, high: set[int]) -> None:
    """One write per chunk: loss 20 at the `high` steps, 1 elsewhere."""
    now = time.time()
    lines = [
        json.dumps({"step": s, "time": now, "loss": 20.0 if s in high else 1.0}) for s in steps
    ]
    with path.open("a") as f:
        f.write("\n".join(lines) + "\n")


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


def delivered(req: Request) -> list[tuple[str, int]]:
    """(state, step) of each alert a json:// message carried."""
    out = []
    for section in req.json()["message"].split("\n\n---\n\n"):
        state = "resolved" if " resolved (" in section.split("\n", 1)[0] else "firing"
        match = STEP.search(section)
        assert match, section
        out.append((state, int(match.group(1))))
    return out
