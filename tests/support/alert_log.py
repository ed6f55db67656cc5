"""What a daemon under test said: its `--alerts-jsonl` file and `trainsentry status`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def alerts(path: Path) -> list[dict[str, Any]]:
    """The alert lines written so far (a line being written is left for the next look)."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def find(path: Path, **want: str) -> dict[str, Any] | None:
    """The first alert line with these values, or None."""
    return next((a for a in alerts(path) if all(a.get(k) == v for k, v in want.items())), None)


def status_of(address: str) -> str:
    """What `trainsentry status` prints of the daemon at `address`."""
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", "status", "--address", address],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
