"""Unreadable paths: said once per reason, said again when readable."""

from __future__ import annotations

from trainsentry.sources.access import AccessProblems


def test_a_path_is_said_once_per_reason_and_when_it_reads_again() -> None:
    said: list[str] = []
    access = AccessProblems(said.append)
    access.failed("/logs/a/mlflow.db", "not a SQLite database", "read again at its next change")
    access.failed("/logs/a/mlflow.db", "not a SQLite database", "read again at its next change")
    access.readable("/logs/b/metrics.jsonl")  # never failed: nothing to say
    access.failed("/logs/a/mlflow.db", "a SQLite file with no MLflow tables")
    assert access.failing == {"/logs/a/mlflow.db": "a SQLite file with no MLflow tables"}
    access.readable("/logs/a/mlflow.db")
    access.readable("/logs/a/mlflow.db")
    assert said == [
        "cannot read /logs/a/mlflow.db: not a SQLite database; read again at its next change",
        "cannot read /logs/a/mlflow.db: a SQLite file with no MLflow tables; retried on every "
        "sweep, and read from where it stopped once it can be (check the daemon user's "
        "permissions)",
        "/logs/a/mlflow.db can be read again",
    ]
    assert access.failing == {}
