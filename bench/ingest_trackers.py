"""How fast trainsentry reads MLflow's and W&B's local stores, against the trackers' own readers.

Both are measured in the same run, on the same files, and the ratio printed:

- an `mlflow.db` of RUNS runs × KEYS keys × STEPS steps, written by MLflow's
  own `log_batch`; read by trainsentry (the offline reader `dump` uses) and by
  `MlflowClient.get_metric_history` for every run and key (what a script or
  the MLflow UI calls);
- a W&B offline run of STEPS history rows of KEYS keys, written by `wandb.log`;
  read by trainsentry and by W&B's own protobuf classes (`wandb_internal_pb2.Record`)
  over the same record framing: wandb 0.31 ships no Python reader of its run
  file, so its generated protobuf parser is the tracker's own part of reading it.

    python bench/ingest_trackers.py            # 1,600,000 MLflow points, 400,000 W&B points
    python bench/ingest_trackers.py --quick    # a tenth

Files are cached under bench/.cache/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import sys
import time
from pathlib import Path

from cache import cached

KEYS = 4
RUNS = 4


def _value(step: int, key: int) -> float:
    return math.exp(-step / 20000) * (1 + key) + 0.01 * math.sin(step * 0.37 + key)


def write_mlflow(directory: Path, steps: int) -> None:
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{directory / 'mlflow.db'}")
    exp = client.create_experiment("bench")
    for r in range(RUNS):
        run = client.create_run(exp, run_name=f"run{r}").info.run_id
        batch: list[Metric] = []
        for step in range(steps):
            stamp = 1_796_000_000_000 + step
            batch.extend(Metric(f"train/m{k}", _value(step, k), stamp, step) for k in range(KEYS))
            if len(batch) >= 1000:
                client.log_batch(run, metrics=batch)
                batch = []
        if batch:
            client.log_batch(run, metrics=batch)


def write_wandb(directory: Path, steps: int) -> None:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(directory))
    import wandb

    run = wandb.init(project="bench", name="bench")
    for step in range(steps):
        wandb.log({f"train/m{k}": _value(step, k) for k in range(KEYS)})
    run.finish()


def trainsentry_points(path: Path) -> tuple[int, float]:
    from trainsentry.sources.reading import iter_batches

    start = time.perf_counter()
    n = sum(len(batch) for batch in iter_batches([path]))
    return n, time.perf_counter() - start


def mlflow_points(path: Path) -> tuple[int, float]:
    from mlflow.tracking import MlflowClient

    start = time.perf_counter()
    client = MlflowClient(f"sqlite:///{path / 'mlflow.db'}")
    n = 0
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            for key in run.data.metrics:
                n += len(client.get_metric_history(run.info.run_id, key))
    return n, time.perf_counter() - start


def wandb_points(path: Path) -> tuple[int, float]:
    """W&B's Record parser over the LevelDB-log framing (wandb's former datastore loop)."""
    from wandb.proto import wandb_internal_pb2

    (run_file,) = path.glob("wandb/offline-run-*/run-*.wandb")
    start = time.perf_counter()
    data = run_file.read_bytes()
    n, i, parts = 0, 7, []
    while i + 7 <= len(data):
        left = 32768 - i % 32768
        if left < 7:
            i += left
            continue
        _, length, kind = struct.unpack_from("<IHB", data, i)
        parts.append(data[i + 7 : i + 7 + length])
        i += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            if record.HasField("history"):
                n += sum(
                    1
                    for item in record.history.item
                    if not (item.key or "/".join(item.nested_key)).startswith("_")
                )
    return n, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--json", type=Path, help="also write each store's result to this file (bench/all.py)"
    )
    args = parser.parse_args()
    steps = 10_000 if args.quick else 100_000
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "daemon"))
    mlflow_dir = cached(f"mlflow-{steps}", lambda d: write_mlflow(d, steps), "an mlflow.db")
    wandb_dir = cached(f"wandb-{steps}", lambda d: write_wandb(d, steps), "a W&B offline run")
    found: dict[str, dict[str, object]] = {}
    for name, path, peer, peer_name in (
        ("mlflow.db", mlflow_dir, mlflow_points, "MlflowClient.get_metric_history"),
        (".wandb", wandb_dir, wandb_points, "wandb_internal_pb2.Record"),
    ):
        ours, ours_s = trainsentry_points(path)
        theirs, theirs_s = peer(path)
        print(
            f"{name:10} trainsentry {ours:>9,} points in {ours_s:6.2f} s "
            f"({ours / ours_s:>12,.0f}/s) | {peer_name} {theirs:>9,} in {theirs_s:6.2f} s "
            f"({theirs / theirs_s:>12,.0f}/s) | ratio x{theirs_s / ours_s:.1f}"
        )
        if ours != theirs:
            print(f"  counts differ: trainsentry {ours}, {peer_name} {theirs}")
        found[name] = {"points": ours, "seconds": ours_s, "peer": peer_name,
                       "peer_points": theirs, "peer_seconds": theirs_s}  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(found))


if __name__ == "__main__":
    main()
