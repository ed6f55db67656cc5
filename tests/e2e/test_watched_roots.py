"""Several watched roots: each root's runs are its own, in live, replay and the stop file."""

from __future__ import annotations

import json
import time
from pathlib import Path

from support.daemon_process import DaemonProcess, live_alerts, replayed_alerts

from trainsentry.point import Row
from trainsentry.runtime.loop import Daemon
from trainsentry.sources.reading import iter_points
from trainsentry.sources.shard import Shard
from trainsentry.state.db import StateDB

STOP_RULES = """\
version: 1
rules:
  - name: loss_nan_stop
    metric: loss
    severity: critical
    non_finite:
    actions: [stop]
"""


def write_job(run_dir: Path, nan_from: int | None = None, steps: int = 100) -> None:
    """A JSONL job of recent wall times (inside the history horizon), NaN from `nan_from` on."""
    run_dir.mkdir(parents=True)
    start = time.time() - steps
    with (run_dir / "metrics.jsonl").open("w") as f:
        for step in range(steps):
            loss = float("nan") if nan_from is not None and step >= nan_from else 2.0 - step / 100
            f.write(json.dumps({"step": step, "time": start + step, "loss": loss}) + "\n")


def two_roots(tmp_path: Path) -> tuple[Path, Path]:
    """roots/A/exp healthy, roots/B/exp NaN from step 49: the same run path in both."""
    a, b = tmp_path / "roots" / "A", tmp_path / "roots" / "B"
    write_job(a / "exp")
    write_job(b / "exp", nan_from=49)
    (tmp_path / "stop.yaml").write_text(STOP_RULES)
    return a, b


def test_the_stop_file_of_a_run_goes_into_its_own_roots_job(tmp_path: Path) -> None:
    a, b = two_roots(tmp_path)
    args = [str(a), str(b), "--rules", "default", "--rules", str(tmp_path / "stop.yaml")]
    daemon = DaemonProcess(
        *args, "--state-dir", str(tmp_path / "s"), "--http", "off", merge_stderr=True
    )
    try:
        wrote = daemon.wait_for_text("wrote ")
    finally:
        daemon.stop()
    assert "loss_nan_stop on B/exp" in wrote
    assert (b / "exp" / ".trainsentry" / "STOP").exists()
    assert not (a / "exp" / ".trainsentry").exists()


def test_with_a_control_dir_each_roots_run_has_its_own_stop_file(tmp_path: Path) -> None:
    a, b = two_roots(tmp_path)
    control = tmp_path / "control"
    daemon = DaemonProcess(
        *(str(a), str(b), "--rules", str(tmp_path / "stop.yaml"), "--control-dir", str(control)),
        *("--state-dir", str(tmp_path / "s"), "--http", "off"),
        merge_stderr=True,
    )
    try:
        daemon.wait_for_text("wrote ")
    finally:
        daemon.stop()
    assert [p.relative_to(control) for p in control.rglob("STOP")] == [
        Path("B/exp/.trainsentry/STOP")
    ]


def test_live_and_replay_of_several_roots_name_their_runs_alike(tmp_path: Path) -> None:
    a, b = two_roots(tmp_path)
    rules = ["--rules", str(tmp_path / "stop.yaml")]
    live = live_alerts(
        tmp_path / "alerts.jsonl", str(a), str(b), *rules, "--state-dir", str(tmp_path / "s")
    )
    replayed = replayed_alerts(str(a), str(b), *rules)
    assert [(t["run"], t["state"], t["step"]) for t in live] == [("B/exp", "firing", 49)]
    assert [(t["run"], t["state"], t["step"]) for t in replayed] == [("B/exp", "firing", 49)]


def followed_runs(
    tmp_path: Path, roots: list[Path], shard: Shard | None = None
) -> dict[str, set[str]]:
    """run id → the files a daemon on `roots` follows for it."""
    got: dict[str, set[str]] = {}

    def collect(run: str, rows: list[Row]) -> None:
        got.setdefault(run, set())

    daemon = Daemon(
        roots,
        StateDB(tmp_path / f"state-{shard}.db"),
        [collect],
        poll=60,
        owns_run=shard.owns if shard else None,
    )
    daemon.start()
    daemon.close()
    return {run: {str(f.relative_to(tmp_path)) for f in daemon.run_files(run)} for run in got}


def test_shards_share_out_the_runs_of_several_roots_one_by_one(tmp_path: Path) -> None:
    a, b = two_roots(tmp_path)
    owned = [followed_runs(tmp_path, [a, b], Shard(i, 2)) for i in (1, 2)]
    merged = {run: files for part in owned for run, files in part.items()}
    assert sum(len(part) for part in owned) == 2
    assert merged == {
        "A/exp": {"roots/A/exp/metrics.jsonl"},
        "B/exp": {"roots/B/exp/metrics.jsonl"},
    }


def test_a_single_root_keeps_naming_runs_relative_to_itself(tmp_path: Path) -> None:
    a, _ = two_roots(tmp_path)
    assert set(followed_runs(tmp_path, [a])) == {"exp"}


def test_roots_of_the_same_name_are_told_apart_by_their_parents(tmp_path: Path) -> None:
    write_job(tmp_path / "x" / "logs" / "exp")
    write_job(tmp_path / "y" / "logs" / "exp")
    roots = [tmp_path / "x" / "logs", tmp_path / "y" / "logs"]
    assert set(followed_runs(tmp_path, roots)) == {"x/logs/exp", "y/logs/exp"}
    assert {p.run for p in iter_points(roots)} == {"x/logs/exp", "y/logs/exp"}


def test_a_log_file_given_as_the_root_is_the_run_of_its_directory(tmp_path: Path) -> None:
    write_job(tmp_path / "exp")
    assert set(followed_runs(tmp_path, [tmp_path / "exp" / "metrics.jsonl"])) == {"exp"}
