"""MLflow's SQLite store followed from a rowid mark, read-only, never in a writer's way."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from trainsentry.sources.discover import LogFile
from trainsentry.sources.mlflow_db import MlflowDbTail, store_problem
from trainsentry.sources.tail import TailRead


@pytest.fixture
def db(mlflow_db_written: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "mlflow.db"
    shutil.copy(mlflow_db_written, copy)
    return copy


def tail_of(db: Path, **kw: object) -> MlflowDbTail:
    return MlflowDbTail(LogFile(db, "mlflow_db", "store", ""), **kw)  # type: ignore[arg-type]


def read_all(tail: MlflowDbTail) -> list[TailRead]:
    reads = [tail.read()]
    while reads[-1].more:
        reads.append(tail.read())
    return reads


def values(reads: list[TailRead]) -> list[tuple[str, str, int, float]]:
    return [(p.run, p.tag, p.step, p.value) for r in reads for p in r.points]


def add_row(conn: sqlite3.Connection, key: str, step: int, value: float) -> None:
    uuid = conn.execute("SELECT run_uuid FROM runs WHERE name = 'diverge'").fetchone()[0]
    conn.execute(
        "INSERT INTO metrics (key, value, timestamp, run_uuid, step, is_nan) VALUES (?,?,?,?,?,0)",
        (key, value, 1796000000000 + step, uuid, step),
    )


def test_rows_of_several_runs_are_named_by_experiment_run_name_and_run_id(db: Path) -> None:
    got = values(read_all(tail_of(db)))
    runs = {run.rsplit("-", 1)[0] for run, *_ in got}
    assert runs == {"store/exp1/healthy", "store/exp1/diverge"}
    assert len(got) == 2 * 260 * 3


def test_new_rows_are_read_from_the_mark_whatever_their_step(db: Path) -> None:
    tail = tail_of(db)
    read_all(tail)
    with sqlite3.connect(db) as conn:
        add_row(conn, "train/loss", 5, 9.5)  # an earlier step, written later: still new
        add_row(conn, "eval/loss", 300, 1.5)
    got = values(read_all(tail))
    assert [(tag, step, value) for _, tag, step, value in got] == [
        ("train/loss", 5, 9.5),
        ("eval/loss", 300, 1.5),
    ]


def test_a_tail_resumed_from_its_checkpoint_reads_only_what_came_after(db: Path) -> None:
    first = tail_of(db)
    read_all(first)
    checkpoint = first.checkpoint()
    first.close()
    with sqlite3.connect(db) as conn:
        add_row(conn, "train/loss", 400, 2.5)
    again = tail_of(db, checkpoint=checkpoint)
    assert [v[1:] for v in values(read_all(again))] == [("train/loss", 400, 2.5)]
    assert {r.rsplit("-", 1)[0] for r in again.runs} >= {"store/exp1/diverge"}


def test_a_store_locked_by_a_writer_is_read_once_the_writer_lets_go(db: Path) -> None:
    tail = tail_of(db)
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("BEGIN EXCLUSIVE")
    locked, again = tail.read(), tail.read()
    assert (locked.points, locked.unreadable) == ([], None)
    assert (locked.errors, locked.busy) == ([], "locked by a writer")  # no corrupt record
    assert again.busy == "locked by a writer"  # the loop says it once (runtime/loop.py)
    add_row(writer, "train/loss", 500, 3.5)
    writer.execute("COMMIT")
    got = values(read_all(tail))
    assert len(got) == 2 * 260 * 3 + 1
    writer.close()


def test_rows_written_in_wal_mode_are_read_as_they_come(db: Path) -> None:
    writer = sqlite3.connect(db, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    tail = tail_of(db)
    read_all(tail)
    add_row(writer, "train/loss", 600, 4.5)
    assert [v[1:] for v in values(read_all(tail))] == [("train/loss", 600, 4.5)]
    writer.close()


def test_a_truncated_store_is_said_in_one_line_and_never_raises(db: Path) -> None:
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    tail = tail_of(db)
    errors = [e for _ in range(3) for e in tail.read().errors]
    assert len(errors) <= 1
    assert all("damaged MLflow database" in e or "malformed" in e for e in errors)


def test_garbage_named_mlflow_db_is_no_store(tmp_path: Path) -> None:
    bad = tmp_path / "mlflow.db"
    bad.write_bytes(b"\x00garbage" * 512)
    assert store_problem(bad) == "not a SQLite database"
    tail = tail_of(bad)
    assert tail.read().points == []
    assert tail.not_a_store == "not a SQLite database"


def test_a_store_of_a_schema_this_version_does_not_know_is_named_as_such(tmp_path: Path) -> None:
    newer = tmp_path / "mlflow.db"
    with sqlite3.connect(newer) as conn:
        conn.execute("CREATE TABLE experiments (experiment_id INTEGER, name TEXT)")
        conn.execute("CREATE TABLE metrics (metric_key TEXT, val REAL)")
        conn.execute("CREATE TABLE alembic_version (version_num TEXT)")
        conn.execute("INSERT INTO alembic_version VALUES ('ffff00000000')")
    why = store_problem(newer)
    assert why is not None
    assert why.startswith("an mlflow.db of an unsupported version (schema ffff00000000): no ")


def test_an_sqlite_file_of_another_program_is_no_store(tmp_path: Path) -> None:
    other = tmp_path / "optuna.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE studies (id INTEGER)")
    assert store_problem(other) == "a SQLite file with no MLflow tables"


def test_a_store_that_is_none_is_unreadable_until_it_is_one(db: Path, tmp_path: Path) -> None:
    path = tmp_path / "other" / "mlflow.db"
    path.parent.mkdir()
    path.write_bytes(b"\x8fgarbage" * 512)
    tail = tail_of(path)
    assert tail.read().unreadable == "not a SQLite database"
    path.unlink()
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE studies (id INTEGER)")
    assert tail.read().unreadable == "a SQLite file with no MLflow tables"
    shutil.copy(db, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    got = tail.read()
    assert got.unreadable is None and got.points and tail.not_a_store is None


def test_an_empty_sqlite_file_is_a_store_being_made_not_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "mlflow.db"
    sqlite3.connect(path).close()  # what MLflow's engine leaves for a moment before its schema
    tail = tail_of(path)
    got = tail.read()
    assert got.unreadable is None and got.points == []
    assert tail.not_a_store == "an empty SQLite database"
