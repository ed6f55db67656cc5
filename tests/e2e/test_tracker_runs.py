"""What MLflow and W&B say of a run besides its points: its trace (params, tags, config) and
how it ended (MLflow's run status, W&B's exit code), written by the real packages and
checked against what their own clients return, in `replay` and in the live daemon."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import DaemonProcess
from support.http_get import get_json
from support.notify_endpoints import HttpReceiver
from support.ports import free_port
from support.trackers import expected, start_job, write_all
from support.waiting import WAIT, wait_until

from trainsentry.backtest.report import build_report
from trainsentry.rules.loader import load_rules
from trainsentry.sources.reading import iter_ends, iter_points

KINDS = ("mlflow-sqlite-ends", "mlflow-files-ends", "wandb-exit")
REASONS = {
    "finished": "run finished",
    "failed": "run crashed: MLflow run status FAILED",
    "killed": "run cancelled: MLflow run status KILLED",
}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("ended"), KINDS)


def mlflow_run_id(store: str, facts: dict[str, Any]) -> str:
    return f"{store}/{facts['experiment']}/{facts['run_name']}-{facts['run_id'][:8]}"


def wandb_run_id(parent: str, facts: dict[str, Any]) -> str:
    """W&B's run as a user knows it: its project, the name given wandb.init, its id."""
    return f"{parent}/wandb/trackers/{facts['name']}-{facts['id']}"


def resolve_reasons(alerts: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per run, the reasons its alerts resolved with that say how the run ended."""
    out: dict[str, set[str]] = {}
    for a in alerts:
        if a["state"] == "resolved" and a["reason"].startswith("run "):
            out.setdefault(a["run"], set()).add(a["reason"])
    return out


def test_replay_ends_each_trackers_run_as_its_status_or_exit_code_says(
    stores: dict[str, Path],
) -> None:
    got = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", "--format", "jsonl",
         *map(str, stores.values())],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    alerts = [json.loads(line) for line in got.stdout.splitlines()]
    reasons = resolve_reasons(alerts)
    want = {}
    for kind in ("mlflow-sqlite-ends", "mlflow-files-ends"):
        store = kind if kind == "mlflow-sqlite-ends" else f"{kind}/mlruns"
        for facts in expected(stores[kind]):
            want[mlflow_run_id(store, facts)] = {REASONS[facts["run_name"]]}
    want[wandb_run_id("wandb-exit", expected(stores["wandb-exit"]))] = {
        "run crashed: W&B exit code 1"
    }
    assert reasons == want
    fired = {a["run"] for a in alerts if a["state"] == "firing"}
    assert fired == set(want)  # each run diverged before it ended


def test_the_live_daemon_shows_each_runs_trace_and_life_and_ends_its_alerts(
    tmp_path: Path,
) -> None:
    root, state, out = tmp_path / "logs", tmp_path / "state", tmp_path / "alerts.jsonl"
    root.mkdir()
    address = f"127.0.0.1:{free_port()}"
    receiver = HttpReceiver()
    daemon = DaemonProcess(
        str(root), "--state-dir", str(state), "--http", address, "--alerts-jsonl", str(out),
        "--notify", f"json://{receiver.url}/hook", merge_stderr=True,
    )  # fmt: skip
    try:
        daemon.wait_for_text("caught up")
        jobs = [start_job(kind, root / kind, "60", "10") for kind in KINDS]
        for job in jobs:
            _, err = job.communicate(timeout=300)
            assert job.returncode == 0, err.decode(errors="replace")[-2000:]
        want_life: dict[str, tuple[str, str]] = {}
        want_trace: dict[str, dict[str, dict[str, str]]] = {}
        for kind in ("mlflow-sqlite-ends", "mlflow-files-ends"):
            store = kind if kind == "mlflow-sqlite-ends" else f"{kind}/mlruns"
            for facts in expected(root / kind):
                run = mlflow_run_id(store, facts)
                state_, cause = REASONS[facts["run_name"]].removeprefix("run ").partition(": ")[::2]
                want_life[run] = (state_, cause)
                want_trace[run] = {"params": facts["params"], "tags": facts["tags"]}
        wandb_facts = expected(root / "wandb-exit")
        wandb_run = wandb_run_id("wandb-exit", wandb_facts)
        want_life[wandb_run] = ("crashed", "W&B exit code 1")

        def lives() -> dict[str, tuple[str, str]]:
            runs = get_json(address, "/api/runs")["runs"]
            return {r["run"]: (r["state"], r["cause"]) for r in runs if r["run"] in want_life}

        wait_until(lambda: lives() == want_life, "every run's end shown", timeout=2 * WAIT)
        runs = {r["run"]: r for r in get_json(address, "/api/runs")["runs"]}
        wait_until(
            lambda: set(resolve_reasons(alerts_of(out))) == set(want_life),
            "every run's alerts ended",
        )
    finally:
        daemon.stop()
        receiver.close()
    reasons = resolve_reasons(alerts_of(out))
    for run, trace in want_trace.items():
        assert runs[run]["trace"] == trace, run
    # the W&B run's stdout (files/output.log) is a log of that run, not a run of its own
    assert not [run for run in runs if "offline-run-" in run]
    config = {
        "lr": "0.001", "optimizer": "adamw", "model/depth": "4", "model/width": "256",
    }  # fmt: skip
    assert wandb_facts["config"]["model"] == {"depth": 4, "width": 256}
    assert runs[wandb_run]["trace"]["config"] == config
    assert runs[wandb_run]["trace"]["run"]["name"] == "crashy"
    assert runs[wandb_run]["trace"]["run"]["id"] == wandb_facts["id"]
    for run, (life, cause) in want_life.items():
        reason = f"run {life}: {cause}" if cause else f"run {life}"
        assert reasons[run] == {reason}, run
    # an incident bundle names what the run was started with
    failed = next(r for r in want_trace if "/failed-" in r and r.startswith("mlflow-sqlite"))
    bundles = list((state / "incidents").joinpath(*failed.split("/")).glob("*.json"))
    assert bundles
    assert json.loads(bundles[0].read_text())["run"]["trace"]["params"]["lr"] == "0.001"


def alerts_of(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_the_backtest_report_ends_each_trackers_run_as_replay_does(
    stores: dict[str, Path],
) -> None:
    paths = [stores["mlflow-sqlite-ends"]]
    html = build_report(iter_points(paths), load_rules(), order="input", ends=iter_ends(paths))
    for reason in REASONS.values():
        assert reason in html
