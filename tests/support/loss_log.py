"""A JSONL run whose loss jumps above a threshold at chosen steps, and what receivers got of it.

Shared by the tests that run the real daemon against a local receiver: one
critical rule, chunks written in one write each (the daemon reads a chunk in
one cycle), and the (state, step) pairs a json:// message carried, to compare
with those the outbox confirmed (support/state_db.py).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from support.notify_endpoints import Request

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


def delivered(req: Request) -> list[tuple[str, int]]:
    """(state, step) of each alert a json:// message carried."""
    out = []
    for section in req.json()["message"].split("\n\n---\n\n"):
        state = "resolved" if " resolved (" in section.split("\n", 1)[0] else "firing"
        match = STEP.search(section)
        assert match, section
        out.append((state, int(match.group(1))))
    return out
