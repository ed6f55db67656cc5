"""A JSON document from the daemon's HTTP API, as a scraper or `status` reads it."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def get_json(address: str, path: str) -> Any:
    """`address` is `host:port`; `path` e.g. `/api/runs`."""
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:
        return json.loads(resp.read())
