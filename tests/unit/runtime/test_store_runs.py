"""A store of many runs (one mlflow.db) counts each of its runs as a run: for `--shard`,
for the daemon's run limit, and for where a run's stop file goes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainsentry.point import Row
from trainsentry.runtime import loop
from trainsentry.runtime.loop import Daemon
from trainsentry.sources.shard import Shard
from trainsentry.state.db import StateDB


@pytest.fixture
def root(mlflow_db_written: Path, tmp_path: Path) -> Path:
    (tmp_path / "proj").mkdir()
    shutil.copy(mlflow_db_written, tmp_path / "proj" / "mlflow.db")
    return tmp_path / "proj"


def runs_read(root: Path, state: Path, **kw: object) -> tuple[Daemon, set[str]]:
    got: set[str] = set()

    def sink(run: str, rows: list[Row]) -> None:
        got.add(run)

    daemon = Daemon([root], StateDB(state), [sink], **kw)  # type: ignore[arg-type]
    daemon.start()
    daemon.sweep()
    while daemon.cycle(timeout=0):
        pass
    return daemon, got


def test_each_run_of_a_store_is_read_by_the_one_shard_that_owns_it(
    root: Path, tmp_path: Path
) -> None:
    _, everything = runs_read(root, tmp_path / "all.db")
    assert len(everything) == 2
    shards = [runs_read(root, tmp_path / f"{i}.db", owns_run=Shard(i, 2).owns)[1] for i in (1, 2)]
    assert shards[0] | shards[1] == everything
    assert not shards[0] & shards[1]
    for i, got in enumerate(shards, 1):
        assert all(Shard(i, 2).owns(run) for run in got)


def test_the_run_limit_counts_a_stores_runs_one_by_one(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loop, "MAX_RUNS", 2)  # the store's file, and one of its runs
    daemon, got = runs_read(root, tmp_path / "state.db")
    assert len(got) == 1
    assert daemon.stats.runs_refused == 1


def test_each_run_of_a_store_has_a_directory_of_its_own_for_its_stop_file(
    root: Path, tmp_path: Path
) -> None:
    daemon, got = runs_read(root, tmp_path / "state.db")
    dirs = {run: daemon.run_dir(run) for run in got}
    for run, directory in dirs.items():
        assert directory == root.joinpath(*run.split("/")[1:])  # proj/exp1/<name>-<id>
    assert len(set(dirs.values())) == len(dirs)
