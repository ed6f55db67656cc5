"""Which tail follows a log: a FileTail for a file of records, MlflowDbTail for a database,
MlflowRunTail for a file-store MLflow run's params, tags and status, CheckpointTail for a
directory of checkpoints.

A byte offset and a decoder follow every log format but three: a SQLite store is
rewritten in place page by page, so it is followed by rowid (mlflow_db.py), a
file-store run's trace is a file per key (mlflow_run.py), and a checkpoint root
is a listing of files and folders (checkpoints.py).
Both have the interface the loop and the offline reader use, `Tail`.
"""

from __future__ import annotations

from trainsentry.sources.checkpoints import CheckpointTail
from trainsentry.sources.discover import LogFile
from trainsentry.sources.mlflow_db import MlflowDbTail
from trainsentry.sources.mlflow_run import MlflowRunTail
from trainsentry.sources.tail import FileTail
from trainsentry.state.db import Checkpoint

Tail = FileTail | MlflowDbTail | MlflowRunTail | CheckpointTail


def follow(
    log: LogFile, checkpoint: Checkpoint | None = None, *, relearn_from: Checkpoint | None = None
) -> Tail:
    """A tail of `log` resuming at `checkpoint` (see FileTail and CheckpointTail for
    `relearn_from`)."""
    if log.kind == "mlflow_db":
        return MlflowDbTail(log, checkpoint)
    if log.kind == "mlflow_run":
        return MlflowRunTail(log, checkpoint)
    if log.kind == "checkpoints":
        return CheckpointTail(log, checkpoint, relearn_from=relearn_from)
    return FileTail(log, checkpoint, relearn_from=relearn_from)
