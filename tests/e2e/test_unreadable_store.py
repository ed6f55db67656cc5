"""A tracker's store that cannot be read is said, shown and counted by the live daemon: an
`mlflow.db` of random bytes and a SQLite file with no MLflow tables are each a WARNING once
per reason, a run `unreadable` with the reason in `/api/runs` and `status`, a gauge on
`/metrics`; the store made a real one (written by MLflow) is said to read again, and read."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from support.daemon_process import DaemonProcess
from support.ports import free_port
from support.trackers import start_job
from support.waiting import wait_until

RANDOM = "not a SQLite database"
NO_TABLES = "a SQLite file with no MLflow tables"


def get(port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return resp.read().decode()


def runs(port: int) -> dict[str, Any]:
    return json.loads(get(port, "/api/runs"))


def unreadable_gauge(port: int) -> float:
    for family in text_string_to_metric_families(get(port, "/metrics")):
        if family.name == "trainsentry_paths_unreadable":
            return family.samples[0].value
    raise AssertionError("no trainsentry_paths_unreadable on /metrics")


def sqlite_of_another_tool(path: Path) -> None:
    """An Optuna-like study database: SQLite, tables, none of them MLflow's."""
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, study_name TEXT)")
    db.execute("INSERT INTO studies VALUES (1, 'lr-search')")
    db.commit()
    db.close()


def replace_with(path: Path, make: Any) -> None:
    """`path` replaced at once (written beside it, renamed over it), as a copy tool does."""
    new = path.with_name("incoming.tmp")
    make(new)
    os.replace(new, path)


def warnings_of(daemon: DaemonProcess, path: Path, reason: str) -> list[str]:
    return [x for x in daemon.lines if f"cannot read {path}: {reason}" in x]


def test_a_store_that_is_none_is_said_once_per_reason_shown_counted_and_read_once_it_is_one(
    tmp_path: Path,
) -> None:
    real = tmp_path / "written"
    job = start_job("mlflow-sqlite", real, "80", "20")  # NaN from step 70; written meanwhile
    logs = tmp_path / "logs"
    for run in ("garbage", "optuna", "ok"):
        (logs / run).mkdir(parents=True)
    garbage, optuna = logs / "garbage" / "mlflow.db", logs / "optuna" / "mlflow.db"
    garbage.write_bytes(b"\x8f" + os.urandom(8191))
    sqlite_of_another_tool(optuna)
    (logs / "ok" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    port = free_port()
    daemon = DaemonProcess(
        str(logs), "--state-dir", str(tmp_path / "state"), "--http", f"127.0.0.1:{port}",
        "--alerts-jsonl", str(tmp_path / "alerts.jsonl"), merge_stderr=True,
    )  # fmt: skip
    try:
        said = daemon.wait_for_text(f"cannot read {garbage}: {RANDOM}")
        assert " WARNING " in said and "read again at its next change" in said
        assert " WARNING " in daemon.wait_for_text(f"cannot read {optuna}: {NO_TABLES}")
        wait_until(lambda: len(runs(port)["unreadable"]) == 2, "both stores in /api/runs")
        doc = runs(port)
        shown = {r["run"]: r for r in doc["runs"]}
        assert (shown["garbage"]["state"], shown["garbage"]["cause"]) == ("unreadable", RANDOM)
        assert shown["garbage"]["unreadable"] == [{"path": str(garbage), "reason": RANDOM}]
        assert (shown["optuna"]["state"], shown["optuna"]["cause"]) == ("unreadable", NO_TABLES)
        assert "unreadable" not in shown["ok"]
        assert unreadable_gauge(port) == 2
        status = subprocess.run(
            [sys.executable, "-m", "trainsentry", "status", "--address", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        assert f"garbage (unreadable: {RANDOM})" in status
        assert f"cannot read {garbage}: {RANDOM}" in status.splitlines()
        assert f"cannot read {optuna}: {NO_TABLES}" in status.splitlines()

        # other random bytes: the same reason, not said again; then another reason, said
        replace_with(garbage, lambda p: p.write_bytes(b"\x8f" + os.urandom(4095)))
        replace_with(garbage, sqlite_of_another_tool)
        daemon.wait_for_text(f"cannot read {garbage}: {NO_TABLES}")

        # the store becomes MLflow's own: said to read again, and its diverging run pages
        assert job.wait(timeout=300) == 0, job.stderr.read() if job.stderr else ""
        replace_with(garbage, lambda p: shutil.copy(real / "mlflow.db", p))
        daemon.wait_for_text(f"{garbage} can be read again")
        wait_until(lambda: len(runs(port)["unreadable"]) == 1, "the store off /api/runs")
        alerts = tmp_path / "alerts.jsonl"
        wait_until(
            lambda: (
                alerts.exists()
                and any(
                    '"loss_non_finite"' in x and "garbage/exp1/diverge" in x
                    for x in alerts.read_text().splitlines()
                )
            ),
            "the MLflow run's NaN paged",
        )
        assert unreadable_gauge(port) == 1
        shown = {r["run"]: r for r in runs(port)["runs"]}
        assert shown.get("garbage", {}).get("state") != "unreadable"
    finally:
        daemon.stop()
        if job.poll() is None:
            job.kill()
    assert daemon.proc.returncode == 0, "".join(daemon.lines[-20:])
    assert len(warnings_of(daemon, garbage, RANDOM)) == 1
    assert len(warnings_of(daemon, garbage, NO_TABLES)) == 1
    assert len(warnings_of(daemon, optuna, NO_TABLES)) == 1
