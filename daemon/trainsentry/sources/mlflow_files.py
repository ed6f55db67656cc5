"""MLflow's file store: `mlruns/<experiment id>/<run id>/metrics/<key>`, one file per metric.

Each line is `<timestamp ms> <value> <step>`, appended by `mlflow.log_metric`
(MLflow 3 writes this store only with MLFLOW_ALLOW_FILE_STORE=true; the
SQLite store is its default, see mlflow_db.py). The key is the file's path
under `metrics/` (a key with `/` is a nested directory), so the decoder emits
values under an empty tag and the file's LogFile carries the key as its tag
prefix: the tail then names every value, as it names Keras' splits.

The run is MLflow's: `<store>/<experiment name>/<run name>-<run id[:8]>`, the
names read from the experiment's and run's `meta.yaml` (see `run_name`). The
run id's head keeps two runs of one name apart (a rerun of "baseline") in live
and offline reading alike, without either having to know the other.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from trainsentry.point import Row
from trainsentry.sources.base import Decoded, DecodeError, Lines

METRICS_DIR = "metrics"
RECORD_DIRS = ("params", "tags")
# MLflow's final run statuses as run lives (rules/run_life.py), with their causes; a
# file store's meta.yaml writes them as RunStatus numbers
ENDINGS = {
    "FINISHED": ("finished", ""),
    "FAILED": ("crashed", "MLflow run status FAILED"),
    "KILLED": ("cancelled", "MLflow run status KILLED"),
}
STATUS_NUMBERS = {"3": "FINISHED", "4": "FAILED", "5": "KILLED"}
_TAG = ("",)


def metric_key(path: Path) -> tuple[Path, str] | None:
    """(the run directory, the metric key) of a file-store metric file; None for other files."""
    parts = path.parts
    if METRICS_DIR not in parts[:-1]:
        return None
    at = len(parts) - 1 - parts[::-1].index(METRICS_DIR, 1)
    run_dir = Path(*parts[:at])
    if not (run_dir / "meta.yaml").is_file() or not (run_dir.parent / "meta.yaml").is_file():
        return None
    return run_dir, "/".join(parts[at + 1 :])


def run_record(path: Path) -> Path | None:
    """The run directory whose `meta.yaml`, param or tag `path` is; None for other files.
    A run's params, tags and status are followed by one tail per run (mlflow_run.py)."""
    parts = path.parts
    if path.name == "meta.yaml":
        run_dir = path.parent
    else:
        at = max((i for i, p in enumerate(parts[:-1]) if p in RECORD_DIRS), default=-1)
        if at < 1:
            return None
        run_dir = Path(*parts[:at])
    if not (run_dir / "meta.yaml").is_file() or not (run_dir.parent / "meta.yaml").is_file():
        return None
    return run_dir if (run_dir / METRICS_DIR).is_dir() or (run_dir / "tags").is_dir() else None


def run_key(run_dir: Path) -> Path:
    """The path a run's params-tags-status tail is known by: its `tags` directory, which
    sorts after its metric files, so a cycle reads the run's last metrics before its end
    (mlflow_run.py)."""
    return run_dir / "tags"


def yaml_field(path: Path, field: str) -> str:
    """A top-level scalar of an MLflow meta.yaml, without a YAML parser on the hot path:
    MLflow writes these files with yaml.safe_dump, one `key: value` a line."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return line[len(field) + 1 :].strip().strip("'\"")
    except OSError:
        pass
    return ""


@lru_cache(maxsize=4096)
def run_name(run_dir: Path) -> str:
    """`<experiment name>/<run name>-<run id[:8]>` of a file-store run directory."""
    experiment = yaml_field(run_dir.parent / "meta.yaml", "name") or run_dir.parent.name
    try:
        name = (run_dir / "tags" / "mlflow.runName").read_text(errors="replace").strip()
    except OSError:
        name = yaml_field(run_dir / "meta.yaml", "run_name")
    return f"{experiment.replace('/', '_')}/{(name or 'run').replace('/', '_')}-{run_dir.name[:8]}"


def store_relative(run_dir: Path) -> Path:
    """The store directory (`mlruns`) of a run directory: the runs are named under it."""
    return run_dir.parent.parent


class MlflowMetricDecoder:
    """Lines `timestamp value step` → one Row each, under the empty tag (see above)."""

    def __init__(self) -> None:
        self._lines = Lines()

    def feed(self, data: bytes | memoryview, *, at_eof: bool, file_time: float) -> Decoded:
        consumed, offset, lines, cut = self._lines.split(data)
        out = Decoded(consumed=consumed)
        if cut is not None:
            out.errors.append(cut)
        for number, line in enumerate(lines, self._lines.first(lines)):
            at = offset
            offset += len(line) + 1
            fields = line.split()
            if not fields:
                continue
            try:
                stamp, value = int(fields[0]), float(fields[1])
                step = int(fields[2]) if len(fields) > 2 else 0
            except (ValueError, IndexError):
                out.errors.append(DecodeError(at, "not an MLflow metric line: skipped", number))
                continue
            wall = stamp / 1000.0 if math.isfinite(stamp) else file_time
            out.rows.append(Row(step, wall, _TAG, (value,)))
        return out

    def snapshot(self) -> dict[str, Any]:
        return self._lines.save({"skipping": self._lines.skipping})

    def restore(self, state: dict[str, Any]) -> None:
        self._lines.load(state)

    def continue_from(self, previous: dict[str, Any]) -> None:
        """MLflow only appends to a metric file; a rewrite is read anew."""
