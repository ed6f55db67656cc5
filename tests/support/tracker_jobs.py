"""Tiny training loops that log through the real MLflow and W&B packages, no network.

Usage: python tracker_jobs.py KIND DIR [STEPS [DIVERGE_AT [JUMP_AT]]]
KIND is `mlflow-sqlite` (MLflow 3's default store, DIR/mlflow.db), `mlflow-files`
(the file store under DIR/mlruns, MLFLOW_ALLOW_FILE_STORE=true) or `wandb`
(offline mode, DIR/wandb/offline-run-*). The MLflow kinds log two runs of
experiment "exp1", "healthy" and "diverge"; W&B logs "diverge" alone. The kinds
`mlflow-sqlite-ends` and `mlflow-files-ends` log three diverging runs ended
FINISHED, FAILED and KILLED, with params and tags; `wandb-exit` a run named
"crashy", with a config, that exits with code 1. A
diverging run's gradient norm grows 15% a step from DIVERGE_AT on and its loss
follows until it is NaN: what the default pack must alert on. From JUMP_AT on
(the MLflow and W&B kinds), the diverging run's lr is ×100 and its loss ×12 at
that step, ×4 after: an lr jump and a loss spike in one step.

Afterwards DIR/expected.json holds what the tracker's own reader returns:
MlflowClient.get_metric_history for every run and key; for W&B, which ships
no reader of its run file, what the loop handed wandb.log with the step W&B
gave it (and W&B's wandb-summary.json where it wrote one).
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
from pathlib import Path


def series(steps: int, diverge_at: int, seed: int, jump_at: int = -1) -> list[dict[str, float]]:
    """The logged dicts, step by step: a loss falling with noise, then blowing up."""
    rng = random.Random(seed)
    out = []
    for step in range(steps):
        loss = 2.0 * math.exp(-step / 80) + 0.2 + rng.uniform(-0.02, 0.02)
        grad = 1.0 + rng.uniform(-0.05, 0.05)
        lr = 1e-3
        if 0 <= diverge_at <= step:
            grow = 1.15 ** (step - diverge_at)
            grad *= grow
            loss *= grow
            if grow > 1e3:
                loss = math.nan
        if 0 <= jump_at <= step:
            lr *= 100
            loss *= 12 if step == jump_at else 4
        out.append({"train/loss": loss, "train/grad_norm": grad, "train/learning_rate": lr})
    return out


def mlflow_uri(directory: Path, files: bool) -> str:
    """The tracking URI of the store under `directory`: the file store, or MLflow 3's default."""
    if files:
        os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        return (directory / "mlruns").as_uri()
    return f"sqlite:///{directory / 'mlflow.db'}"


def mlflow_runs(
    directory: Path, steps: int, diverge_at: int, files: bool, jump_at: int = -1
) -> None:
    uri = mlflow_uri(directory, files)
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("exp1")
    for name, at, seed, jump in (("healthy", -1, 1, -1), ("diverge", diverge_at, 2, jump_at)):
        with mlflow.start_run(run_name=name):
            mlflow.log_params({"lr": 1e-3, "seed": seed})
            for step, values in enumerate(series(steps, at, seed, jump)):
                mlflow.log_metrics(values, step=step)
    client = MlflowClient(uri)
    expected = []
    for exp in client.search_experiments():
        for run in client.search_runs([exp.experiment_id]):
            for key in run.data.metrics:
                for m in client.get_metric_history(run.info.run_id, key):
                    expected.append(
                        {
                            "run_id": run.info.run_id,
                            "run_name": run.info.run_name,
                            "experiment": exp.name,
                            "tag": key,
                            "step": m.step,
                            "wall_time": m.timestamp / 1000,
                            "value": m.value,
                        }
                    )
    (directory / "expected.json").write_text(json.dumps(expected))


ENDINGS = ("FINISHED", "FAILED", "KILLED")


def mlflow_ended_runs(directory: Path, steps: int, diverge_at: int, files: bool) -> None:
    """A diverging run ended with each of MLflow's final statuses, with params and tags;
    expected.json holds what MlflowClient.get_run says of each."""
    uri = mlflow_uri(directory, files)
    import mlflow
    from mlflow.tracking import MlflowClient

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("exp1")
    ids = []
    for seed, status in enumerate(ENDINGS):
        run = mlflow.start_run(run_name=status.lower())
        mlflow.log_params({"lr": 1e-3, "seed": seed, "model/depth": 4})
        mlflow.set_tags({"team": "vision", "status_wanted": status})
        for step, values in enumerate(series(steps, diverge_at, seed)):
            mlflow.log_metrics(values, step=step)
        mlflow.end_run(status=status)
        ids.append(run.info.run_id)
    client = MlflowClient(uri)
    expected = []
    for run_id in ids:
        run = client.get_run(run_id)
        expected.append(
            {
                "run_id": run_id,
                "run_name": run.info.run_name,
                "experiment": "exp1",
                "status": run.info.status,
                "end_time": run.info.end_time,
                "params": run.data.params,
                "tags": run.data.tags,
            }
        )
    (directory / "expected.json").write_text(json.dumps(expected))


def wandb_exit(directory: Path, steps: int, diverge_at: int) -> None:
    """A W&B offline run named "crashy" with a config, that exits with code 1."""
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(directory))
    import wandb

    config = {"lr": 1e-3, "optimizer": "adamw", "model": {"depth": 4, "width": 256}}
    run = wandb.init(project="trackers", name="crashy", config=config)
    for values in series(steps, diverge_at, 2):
        wandb.log(values)
    run_dir = Path(run.dir).parent
    facts = {"run_dir": str(run_dir), "id": run.id, "name": run.name, "config": dict(run.config)}
    run.finish(exit_code=1)
    (directory / "expected.json").write_text(json.dumps(facts))


def wandb_run(directory: Path, steps: int, diverge_at: int, jump_at: int = -1) -> None:
    os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true", WANDB_DIR=str(directory))
    import wandb

    run = wandb.init(project="trackers", name="diverge")
    logged = []
    for values in series(steps, diverge_at, 2, jump_at):
        wandb.log(values)
        logged.append({"step": run.step - 1, **values})
    run_dir = Path(run.dir).parent
    run.finish()
    written = run_dir / "files" / "wandb-summary.json"  # written online; offline, not always
    summary = json.loads(written.read_text()) if written.exists() else None
    (directory / "expected.json").write_text(
        json.dumps({"run_dir": str(run_dir), "logged": logged, "summary": summary})
    )


def main() -> None:
    kind, directory = sys.argv[1], Path(sys.argv[2])
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 260
    diverge_at = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    jump_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    directory.mkdir(parents=True, exist_ok=True)
    if kind == "wandb":
        wandb_run(directory, steps, diverge_at, jump_at)
    elif kind == "wandb-exit":
        wandb_exit(directory, steps, diverge_at)
    elif kind.endswith("-ends"):
        mlflow_ended_runs(directory, steps, diverge_at, files=kind == "mlflow-files-ends")
    else:
        mlflow_runs(directory, steps, diverge_at, files=kind == "mlflow-files", jump_at=jump_at)
    print("done", flush=True)


if __name__ == "__main__":
    main()
