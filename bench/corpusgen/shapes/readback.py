"""What a run's log files hold, read with the writers' own libraries, for its label.

The label's measured numbers (pre-fault best, final loss, the first logged
point after onset) must be those of the series as written — an HF 500-step
mean, a Keras running mean — not of the raw per-step losses. They are read
with tensorboard's event loader and the csv module, not with trainsentry,
so the ground truth does not depend on the reader under test. Series are
named as `trainsentry replay <run dir>` names them: (the run's sub-directory,
the tag), with Keras' train/ and validation/ folded into their log_dir as
tag prefixes.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

SPLITS = ("train", "validation")
PAIRED = ("test",)  # TF2's tutorial: a test/ writer is a split beside a train/ one
Series = dict[tuple[str, str], list[tuple[int, float]]]


def _run_and_prefix(directory: Path, run_dir: Path) -> tuple[str, str]:
    if directory.name in PAIRED and (directory.parent / "train").is_dir():
        return _parent(directory, run_dir), directory.name + "/"
    if directory.name in SPLITS and directory != run_dir:
        below = directory.parent != run_dir
        others = [s for s in SPLITS + PAIRED if s != directory.name]
        if below or any((directory.parent / s).is_dir() for s in others):
            return _parent(directory, run_dir), directory.name + "/"
    rel = directory.relative_to(run_dir).as_posix()
    return ("" if rel == "." else rel), ""


def _parent(directory: Path, run_dir: Path) -> str:
    rel = directory.parent.relative_to(run_dir).as_posix()
    return "" if rel == "." else rel


def read_series(run_dir: Path) -> Series:
    out: Series = {}
    for path in sorted(run_dir.rglob("*")):
        if not path.is_file():
            continue
        if "tfevents" in path.name:
            _read_events(path, run_dir, out)
        elif path.suffix == ".csv":
            _read_csv(path, run_dir, out)
    for points in out.values():
        points.sort(key=lambda p: p[0])
    return out


def _read_events(path: Path, run_dir: Path, out: Series) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.util import tensor_util

    run, prefix = _run_and_prefix(path.parent, run_dir)
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            if not value.HasField("tensor"):
                continue
            array = tensor_util.make_ndarray(value.tensor)
            if array.shape != () or array.dtype.kind not in "fi":
                continue
            out.setdefault((run, prefix + value.tag), []).append((event.step, float(array)))


def _read_csv(path: Path, run_dir: Path, out: Series) -> None:
    run, _ = _run_and_prefix(path.parent, run_dir)
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            key = "step" if row.get("step") not in (None, "") else "epoch"
            step = int(float(row[key]))
            for tag, cell in row.items():
                if tag in ("step", "epoch") or cell in (None, ""):
                    continue
                try:
                    value = float(cell)
                except ValueError:
                    continue
                out.setdefault((run, tag), []).append((step, value))


def finite(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    return [(s, v) for s, v in points if math.isfinite(v)]
