"""The incident bundle: what the run looked like when an alert fired.

Logs rotate, runs are deleted, and the daemon keeps only a window of recent
points in memory; a person who looks at an alert the next morning should
still see the evidence. So every firing saves, in the state dir,
`incidents/<run>/<rule>-<step>.json`: the alert, the last points of every
series of the run, the last lines of its text logs (`logs`, masked), and the
run's metadata (its directory, its files, its life). The
plot attached to messages is drawn from this file, so the picture matches
the bundle.

Written in the main loop, because the store has one owner; to a temp file,
then renamed, so a reader never sees half a bundle.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

from trainsentry.alert import Transition
from trainsentry.store import Store

POINTS_PER_SERIES = 500
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _safe(part: str) -> str:
    part = _UNSAFE.sub("_", part).strip(".") or "_"
    return part[:120]


def bundle_path(incidents: Path, t: Transition) -> Path:
    """incidents/<run parts>/<rule>-<step>.json; no run id can climb out of the directory."""
    parts = [_safe(p) for p in t.run.split("/") if p not in ("", ".", "..")] or ["_"]
    return incidents.joinpath(*parts, f"{_safe(t.rule)}-{t.step}.json")


def _number(v: float) -> float | str:
    return v if math.isfinite(v) else str(v)


def write_bundle(
    incidents: Path,
    t: Transition,
    store: Store,
    meta: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    series = {
        tag: [
            [p.step, _number(p.wall_time), _number(p.value)]
            for p in s.recent()[-POINTS_PER_SERIES:]
        ]
        for tag, s in sorted(store.series(t.run).items())
    }
    meta = dict(meta)
    logs = meta.pop("logs", None)  # the run's last text-log lines (store/log_lines.py)
    bundle = {
        "alert": t.as_dict(),
        "saved_at": time.time(),
        "run": meta,
        **(extra or {}),
        "series": series,
    }
    if logs is not None:
        bundle["logs"] = logs
    path = bundle_path(incidents, t)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(bundle, ensure_ascii=False, allow_nan=False), encoding="utf-8")
    tmp.replace(path)
    return path
