"""What a path holds when it holds no log trainsentry reads, said in one line.

A path with no readable log and a healthy run that logged nothing new look
alike downstream — no points, no alerts — so the difference is said where it
is known: `dump`/`replay` on stderr, `run` at start, `status` and `/api/runs`.
The line names what was found instead ('no readable logs under runs/; found 12
.json, 3 .txt files'), so the user sees at once whether the job writes somewhere
else, or in a format that is not read (yet).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from trainsentry.sources.discover import CONTROL_DIR, LogFile
from trainsentry.sources.mlflow_db import store_problem
from trainsentry.sources.names import safe_name

# A survey of a huge tree stops counting here: the line is an example, not an inventory.
SURVEY_FILES = 20_000
SHOWN_KINDS = 5


NO_FILES = "no files"  # an empty root: jobs that have not started yet, not a mistake


def readable(logs: Iterable[LogFile]) -> list[LogFile]:
    """The logs that can be read: a SQLite file must be an MLflow store of a known schema."""
    return [log for log in logs if log.kind != "mlflow_db" or store_problem(log.path) is None]


def found_under(top: Path, logs: Iterable[LogFile] = ()) -> str:
    """What the files under `top` are, by suffix, most common first; the SQLite files
    that are no store with why (`logs`: the SQLite files discovery found there)."""
    notes = [f"{log.path.name}: {why}" for log in logs if (why := store_problem(log.path))]
    kinds: Counter[str] = Counter()
    seen = 0
    if top.is_file():
        kinds[top.suffix or top.name] += 1
    else:
        for _, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in (CONTROL_DIR, ".git")]
            for name in filenames:
                kinds[os.path.splitext(name)[1] or "no-suffix"] += 1
                seen += 1
            if seen >= SURVEY_FILES:
                break
    if not kinds:
        return NO_FILES
    ranked = sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0]))[:SHOWN_KINDS]
    shown = [f"{n} {kind}" for kind, n in ranked]
    rest = sum(kinds.values()) - sum(n for _, n in ranked)
    if rest:
        shown.append(f"{rest} other")
    what = ", ".join(shown) + (" file" if sum(kinds.values()) == 1 else " files")
    return "; ".join([what, *notes])


def nothing_readable(top: Path, logs: Iterable[LogFile] = ()) -> str:
    """The one line for a path that holds no readable log."""
    return f"no readable logs under {safe_name(str(top))}; found {found_under(top, logs)}"
