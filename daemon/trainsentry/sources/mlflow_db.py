"""MLflow's SQLite store (`mlflow.db`, MLflow 3's default; any sqlite:/// tracking URI).

One database holds many MLflow runs, so it is followed by its own tail with the
FileTail interface the loop and the offline reader use, whose reads carry the
rows of several runs (`TailRead.others`). The `metrics` table's rows are read
in rowid order from a high-water mark: MLflow only inserts into it (a run's
rows go only when `mlflow gc` deletes the run), SQLite gives a new row the
largest rowid plus one, so `rowid > mark` is exactly what was written since,
whichever runs the rows belong to and in whatever step order.

Never in a writer's way: the database is opened read-only by URI
(`mode=ro`), in autocommit, and each read is one bounded SELECT — its shared
lock lasts that statement, well inside the busy timeout of MLflow's
SQLAlchemy engine. A writer holding the lock makes our read fail fast
(a 50 ms busy timeout); that read is tried again at the next change or sweep,
from the same mark. MLflow's default rollback journal rewrites the database
file in place, and a WAL-mode store writes `-wal` beside it: the loop maps a
change of either to this tail (`discover.store_of`).

Run ids: `<store>/<experiment name>/<run name>-<run id[:8]>`, as for the file
store (mlflow_files.py), where `<store>` names the database's directory as a
run directory would be named.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections import defaultdict
from pathlib import Path

from trainsentry.point import Row, RunEnd, Trace
from trainsentry.sources.base import Shapes
from trainsentry.sources.discover import LogFile
from trainsentry.sources.mlflow_files import ENDINGS
from trainsentry.sources.run_trace import section
from trainsentry.sources.tail import TailRead, stat_or_say
from trainsentry.state.db import Checkpoint

ROWS_PER_READ = 50_000
BUSY_MS = 50
_NEEDED = {"key", "value", "timestamp", "run_uuid", "step", "is_nan"}


class NotAStore(Exception):
    """A SQLite file that holds no MLflow tracking store (an Optuna study, a cache...).

    `empty`: a SQLite database with no tables at all, as MLflow's own store is for
    the moment between its creation and its schema: not said to be unreadable."""

    def __init__(self, why: str, *, empty: bool = False) -> None:
        super().__init__(why)
        self.empty = empty


def _run_id(store: str, experiment: str, name: str, uuid: str) -> str:
    experiment = (experiment or "experiment").replace("/", "_")
    return f"{store}/{experiment}/{(name or 'run').replace('/', '_')}-{uuid[:8]}"


def store_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a SQLite file is not read as an MLflow store; None when it is one (or is
    only locked or damaged now: its tail says so and reads what it can)."""
    tail = MlflowDbTail(LogFile(Path(path), "mlflow_db", "", ""))
    try:
        tail._connect()
    except NotAStore as exc:
        return str(exc)
    except sqlite3.DatabaseError:
        return None
    finally:
        tail.close()
    return None


class MlflowDbTail:
    """Follows an MLflow SQLite store from a rowid high-water mark (see the module)."""

    def __init__(self, log: LogFile, checkpoint: Checkpoint | None = None) -> None:
        self.log = log
        self.path = str(log.path)
        self.skipped_records = 0
        self.relearning = False  # a database keeps no bytes to re-read: resumed as it stood
        self.not_a_store: str | None = None  # why this SQLite file is no MLflow store
        self._mark = 0
        self._dev = self._ino = 0
        self._names: dict[str, str] = {}
        self._shapes = Shapes()
        self._said: set[str] = set()
        self._conn: sqlite3.Connection | None = None
        # Not kept across restarts: a restarted daemon reads the traces again, and says
        # again which of the runs it knows ended (it keeps no run's life).
        self._trace_marks = {"params": 0, "tags": 0}
        self._end_mark = 0
        self._told_end: dict[str, tuple[str, int | None]] = {}
        if checkpoint is not None:
            self._dev, self._ino, self._mark = checkpoint.dev, checkpoint.ino, checkpoint.offset
            self._known = set(checkpoint.decoder_state.get("runs", []))
        else:
            self._known = set()

    @property
    def offset(self) -> int:
        return self._mark

    @property
    def runs(self) -> set[str]:
        """The runs this store delivered rows of (kept across restarts by the checkpoint)."""
        return self._known | {self.log.run}

    def read(self, budget: int = 0, *, same_file: bool = False) -> TailRead:
        out = TailRead(self.log.run)
        st = stat_or_say(self.path, out)
        if st is None:
            return out
        if (st.st_dev, st.st_ino) != (self._dev, self._ino):
            if self._dev or self._ino:  # replaced by another database: read it anew
                self._mark = self._end_mark = 0
                self._trace_marks = dict.fromkeys(self._trace_marks, 0)
                self._names.clear()
                self._told_end.clear()
            self.close()
            self._dev, self._ino = st.st_dev, st.st_ino
        rows: list[tuple] = []
        try:
            conn = self._connect()
            self.not_a_store = None
            ended = self._ended(conn)  # before the metrics: an end's rows are read by then
            # iterated, not fetched whole: in a damaged database the rows before the
            # damage are still delivered
            for row in conn.execute(
                "SELECT rowid, run_uuid, key, value, timestamp, step, is_nan FROM metrics "
                "WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (self._mark, ROWS_PER_READ),
            ):
                rows.append(row)
            if any(r[1] not in self._names for r in rows):
                self._load_names(conn)
            told = self._traces(conn)
        except NotAStore as exc:
            self.not_a_store = str(exc)
            if not exc.empty:  # said (runtime/loop.py): a store that is none is no secret
                out.unreadable = self.not_a_store
            self.close()
            return out
        except sqlite3.OperationalError as exc:
            self.close()
            if "locked" in str(exc) or "busy" in str(exc):
                out.busy = "locked by a writer"
            else:
                self._say(out, f"{self.path}: {exc}: tried again at the next change")
            self._deliver(out, rows)
            return out
        except sqlite3.DatabaseError as exc:  # not a database, malformed, truncated
            self.close()
            self._say(out, f"{self.path}: a damaged MLflow database ({exc}): read what it held")
            self._deliver(out, rows)
            return out
        self._deliver(out, rows)
        out.more = len(rows) == ROWS_PER_READ
        for uuid, trace in told.items():
            out.traces.append((self._name(uuid), trace))
        if not out.more:  # every row of the runs that ended is delivered: say they ended
            self._say_ended(out, ended)
        return out

    def _name(self, uuid: str) -> str:
        return self._names.get(uuid) or _run_id(self.log.run, "", "", uuid)

    def _traces(self, conn: sqlite3.Connection) -> dict[str, Trace]:
        """The params and tags written since the last read, by run: rowid marks, as for
        the metrics (MLflow inserts a param once; a tag set again is updated in place,
        and read again with the run's end)."""
        got: dict[str, Trace] = defaultdict(dict)
        marks = dict(self._trace_marks)
        for table in marks:
            rows = conn.execute(
                f"SELECT rowid, run_uuid, key, value FROM {table} "
                "WHERE rowid > ? ORDER BY rowid LIMIT ?",
                (marks[table], ROWS_PER_READ),
            ).fetchall()
            for _rowid, uuid, key, value in rows:
                got[uuid].setdefault(table, {})[key] = "" if value is None else str(value)
            if rows:
                marks[table] = rows[-1][0]
        self._trace_marks = marks
        if any(uuid not in self._names for uuid in got):
            self._load_names(conn)
        return {uuid: {t: section(e) for t, e in trace.items()} for uuid, trace in got.items()}

    def _ended(self, conn: sqlite3.Connection) -> list[tuple[str, str, int | None]]:
        """Runs whose status is final and not yet told, from an end_time mark."""
        return [
            (uuid, status, end)
            for uuid, status, end in conn.execute(
                "SELECT run_uuid, status, end_time FROM runs WHERE status IN "
                "('FINISHED', 'FAILED', 'KILLED') AND (end_time IS NULL OR end_time >= ?)",
                (self._end_mark,),
            )
            if self._told_end.get(uuid) != (status, end)
        ]

    def _say_ended(self, out: TailRead, ended: list[tuple[str, str, int | None]]) -> None:
        for uuid, status, end in ended:
            self._told_end[uuid] = (status, end)
            if end is not None:
                self._end_mark = max(self._end_mark, end)
            run = self._name(uuid)
            if run not in self._known:  # no metrics: no alert to end, no run shown
                continue
            state, cause = ENDINGS[status]
            try:  # tags set again since they were read (a note, a result)
                assert self._conn is not None
                tags = self._conn.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (uuid,))
                out.traces.append((run, {"tags": section([(k, v or "") for k, v in tags])}))
            except sqlite3.Error:
                pass  # locked now: the tags first read stand
            out.ends.append(RunEnd(state, cause, end / 1000 if end else math.nan, run))

    def _deliver(self, out: TailRead, rows: list[tuple]) -> None:
        by_run: dict[str, list[Row]] = defaultdict(list)
        shapes = self._shapes
        for _rowid, uuid, key, value, stamp, step, is_nan in rows:
            run = self._name(uuid)
            value = math.nan if is_nan else float(value)
            wall = stamp / 1000.0 if stamp is not None else math.nan
            by_run[run].append(Row(int(step), wall, shapes((key,)), (value,)))
        if rows:
            self._mark = rows[-1][0]
        for run, got in by_run.items():
            self._known.add(run)
            out.others.append((run, got))

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                f"file:{self.path}?mode=ro",
                uri=True,
                timeout=BUSY_MS / 1000,
                isolation_level=None,
                check_same_thread=False,
            )
            try:
                columns = {r[1] for r in conn.execute("PRAGMA table_info(metrics)")}
                tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
            except sqlite3.DatabaseError as exc:
                conn.close()
                if "not a database" in str(exc):  # no SQLite header: garbage, or another file
                    raise NotAStore("not a SQLite database") from None
                raise
            if not columns or "experiments" not in tables:
                conn.close()
                if not tables:
                    raise NotAStore("an empty SQLite database", empty=True)
                raise NotAStore("a SQLite file with no MLflow tables")
            if not columns >= _NEEDED:
                version = ""
                if "alembic_version" in tables:
                    got = conn.execute("SELECT version_num FROM alembic_version").fetchone()
                    version = f" (schema {got[0]})" if got else ""
                conn.close()
                missing = ", ".join(sorted(_NEEDED - columns))
                raise NotAStore(f"an mlflow.db of an unsupported version{version}: no {missing}")
            self._conn = conn
        return self._conn

    def _load_names(self, conn: sqlite3.Connection) -> None:
        for uuid, name, experiment in conn.execute(
            "SELECT r.run_uuid, r.name, e.name FROM runs r "
            "LEFT JOIN experiments e ON e.experiment_id = r.experiment_id"
        ):
            self._names[uuid] = _run_id(self.log.run, experiment, name, uuid)

    def _say(self, out: TailRead, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self.skipped_records += 1
            out.errors.append(message)

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(
            path=self.path,
            dev=self._dev,
            ino=self._ino,
            fingerprint=b"",
            offset=self._mark,
            decoder_state={"runs": sorted(self._known)},
        )

    def position(self) -> Checkpoint:
        return self.checkpoint()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
