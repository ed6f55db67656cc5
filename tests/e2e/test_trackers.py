"""MLflow's and W&B's local stores, written by the real packages, read by `dump`, `replay`
and the live daemon, checked against what the trackers' own readers return."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import DaemonProcess
from support.live_follow import follow_job
from support.ports import free_port
from support.trackers import expected, mlflow_points, start_job, write_all
from support.waiting import wait_until

from trainsentry.alert import Transition
from trainsentry.backtest.replay import replay_transitions
from trainsentry.rules.loader import load_rules
from trainsentry.sources.reading import iter_points


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_all(tmp_path_factory.mktemp("trackers"))


def dump(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainsentry", "dump", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def as_tuples(stdout: str) -> list[tuple[str, str, int, float, float]]:
    rows = [json.loads(line) for line in stdout.splitlines()]
    return sorted((r["run"], r["tag"], r["step"], r["wall_time"], r["value"]) for r in rows)


def same(a: list[tuple], b: list[tuple]) -> bool:
    def norm(t: tuple) -> tuple:
        return tuple("nan" if isinstance(x, float) and math.isnan(x) else x for x in t)

    return [norm(t) for t in a] == [norm(t) for t in b]


@pytest.mark.parametrize("kind", ["mlflow-sqlite", "mlflow-files"])
def test_dump_of_an_mlflow_store_equals_mlflow_clients_metric_history(
    stores: dict[str, Path], kind: str
) -> None:
    got = dump(stores[kind])
    assert got.returncode == 0, got.stderr
    store = kind if kind == "mlflow-sqlite" else f"{kind}/mlruns"
    want = mlflow_points(stores[kind], store)
    assert len(want) == 2 * 260 * 3
    assert same(as_tuples(got.stdout), want)
    assert got.stderr == ""


def test_dump_of_a_wandb_offline_run_equals_what_wandb_log_was_given(
    stores: dict[str, Path],
) -> None:
    got = dump(stores["wandb"])
    assert got.returncode == 0, got.stderr
    facts = expected(stores["wandb"])
    run = "wandb/wandb/trackers/diverge-" + Path(facts["run_dir"]).name.rsplit("-", 1)[1]
    want = sorted(
        (run, tag, row["step"], value)
        for row in facts["logged"]
        for tag, value in row.items()
        if tag != "step"
    )
    points = [(r, t, s, v) for r, t, s, _, v in as_tuples(got.stdout)]
    assert same(points, want)
    walls = [w for _, _, _, w, _ in as_tuples(got.stdout)]
    assert all(1.7e9 < w < 2e9 for w in walls)  # W&B's _timestamp, in seconds


def test_the_default_pack_alerts_on_a_run_diverging_in_each_tracker(
    stores: dict[str, Path],
) -> None:
    got = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainsentry",
            "replay",
            "--format",
            "jsonl",
            *map(str, stores.values()),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 0, got.stderr
    fired = {
        (a["run"].split("/")[0], a["run"].rsplit("/", 1)[-1].split("-")[0], a["rule"])
        for a in map(json.loads, got.stdout.splitlines())
        if a["state"] == "firing"
    }
    for store in ("mlflow-sqlite", "mlflow-files", "wandb"):
        rules = {rule for s, _, rule in fired if s == store}
        assert {"grad_norm_exponential_growth", "loss_non_finite"} <= rules, (store, fired)
    assert not {rule for _, name, rule in fired if name == "healthy"}


def test_dump_of_a_path_with_no_readable_log_says_what_it_found_and_exits_3(
    tmp_path: Path,
) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "config.json").write_text("{}")
    (tmp_path / "logs" / "cache.db").write_bytes(b"not sqlite" * 50)
    got = dump(tmp_path / "logs")
    assert got.returncode == 3
    assert got.stdout == ""
    assert got.stderr.splitlines() == [
        f"trainsentry: no readable logs under {tmp_path / 'logs'}; found 1 .db, 1 .json files; "
        "cache.db: not a SQLite database"
    ]


def comparable(ts: list[Transition]) -> list[tuple]:
    return [(t.rule, t.metric, t.state, t.severity, t.step, t.message) for t in ts]


@pytest.mark.parametrize("kind", ["mlflow-sqlite", "mlflow-files", "wandb"])
def test_a_tracker_followed_live_gives_the_points_and_alerts_of_its_replay(
    tmp_path: Path, kind: str
) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    job, got, live = follow_job(
        root, tmp_path / "state.db", lambda: start_job(kind, root / kind, "240", "180")
    )
    assert job.returncode == 0, job.stderr.read().decode() if job.stderr else ""
    replayed_points = list(iter_points([root]))
    # live names runs relative to the root, replay relative to its parent
    assert same(
        sorted((f"logs/{p.run}", *p[1:]) for p in got), sorted(tuple(p) for p in replayed_points)
    )
    replayed = replay_transitions(iter(replayed_points), load_rules(), order="input")
    assert {t.rule for t in live if t.state == "firing"} >= {"grad_norm_exponential_growth"}
    by_run_live = sorted((f"logs/{t.run}", *c) for t, c in zip(live, comparable(live), strict=True))
    by_run_replay = sorted((t.run, *c) for t, c in zip(replayed, comparable(replayed), strict=True))
    assert by_run_live == by_run_replay


def test_a_locked_store_beside_another_run_is_said_locked_not_corrupt_and_the_other_run_is_read(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    root = tmp_path / "logs"
    (root / "jsonl-run").mkdir(parents=True)
    (root / "jsonl-run" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
    shutil.copy(stores["mlflow-sqlite"] / "mlflow.db", root / "mlflow.db")
    writer = sqlite3.connect(root / "mlflow.db", isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        got = dump(root)
    finally:
        writer.close()
    assert got.returncode == 0
    assert [(r, t, v) for r, t, _, _, v in as_tuples(got.stdout)] == [
        ("logs/jsonl-run", "loss", 0.5)
    ]
    assert got.stderr.splitlines() == [
        f"trainsentry: not read: {root / 'mlflow.db'}: locked by a writer; "
        "read it again once the writer lets go",
    ]


def test_run_names_a_watched_path_with_no_readable_log_at_start_in_api_runs_and_status(
    tmp_path: Path,
) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    (root / "notes.txt").write_text("hello")
    port = free_port()
    daemon = DaemonProcess(
        str(root), "--state-dir", str(tmp_path / "state"), "--http", f"127.0.0.1:{port}",
        merge_stderr=True,
    )  # fmt: skip
    line = f"no readable logs under {root}; found 1 .txt file"
    try:
        daemon.wait_for_text(line)
        wait_until(lambda: api(port, "/api/runs")["nothing_readable"] == [line], "the API names it")
        status = subprocess.run(
            [sys.executable, "-m", "trainsentry", "status", "--address", f"127.0.0.1:{port}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert line in status.stdout.splitlines()
        (root / "run1").mkdir()
        (root / "run1" / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}\n')
        wait_until(lambda: api(port, "/api/runs")["nothing_readable"] == [], "read at last")
    finally:
        daemon.stop()


def api(port: int, path: str) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return json.loads(resp.read())
