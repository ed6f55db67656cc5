"""A file-store MLflow run's trace and status: `params/`, `tags/` and `meta.yaml` of its directory.

The metrics of a file-store run are files tailed like any log (mlflow_files.py);
what the run was started with and how it ended are not appended anywhere: a
param is a file per key (`params/lr` holding `0.001`, a key with `/` a nested
directory), a tag likewise, and the status and end time are fields of
`meta.yaml`, rewritten when the run ends. So each run directory is followed by
this tail beside its metric files: a read looks at what changed since the last
one (a file's size and mtime) and hands on the new params and tags as the run's
trace and a final status as its end.

The tail is keyed by the run's `tags` directory (mlflow_files.run_key), not
its `meta.yaml`: the loop reads a cycle's files in sorted order, and `.../tags`
sorts after `.../metrics/...`, so a run that ended has its last metrics
delivered before its end is told (an ended run's later points are its last
words, not judged). Nothing is kept across restarts: a restarted daemon reads
the trace again and says again how the run ended.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from trainsentry.point import RunEnd, Trace
from trainsentry.sources.discover import LogFile
from trainsentry.sources.mlflow_files import ENDINGS, RECORD_DIRS, STATUS_NUMBERS, yaml_field
from trainsentry.sources.run_trace import section
from trainsentry.sources.tail import TailRead, stat_or_say
from trainsentry.state.db import Checkpoint

VALUE_BYTES = 8000  # MLflow's own limit on a param or tag value


class MlflowRunTail:
    """Follows one file-store run directory's params, tags and status (see the module)."""

    def __init__(self, log: LogFile, checkpoint: Checkpoint | None = None) -> None:
        self.log = log
        self.path = str(log.path)
        self.run_dir = log.path.parent
        self.skipped_records = 0
        self.relearning = False
        self.offset = 0
        self._seen: dict[str, tuple[int, int]] = {}  # file → (size, mtime_ns) read
        self._told: tuple[str, str] | None = None  # (status, end_time) said

    @property
    def runs(self) -> set[str]:
        return {self.log.run}

    def read(self, budget: int = 0, *, same_file: bool = False) -> TailRead:
        out = TailRead(self.log.run)
        meta = self.run_dir / "meta.yaml"
        st = stat_or_say(str(meta), out)
        if st is None:
            return out
        trace: Trace = {}
        for name in RECORD_DIRS:
            got = self._changed(self.run_dir / name)
            if got:
                trace[name] = section(got)
        if trace:
            out.traces.append((self.log.run, trace))
        if self._seen.get(str(meta)) != (st.st_size, st.st_mtime_ns):
            self._seen[str(meta)] = (st.st_size, st.st_mtime_ns)
            status, end = yaml_field(meta, "status"), yaml_field(meta, "end_time")
            final = STATUS_NUMBERS.get(status)
            if final is not None and self._told != (status, end):
                self._told = (status, end)
                state, cause = ENDINGS[final]
                wall = int(end) / 1000 if end.isdigit() else math.nan
                out.ends.append(RunEnd(state, cause, wall, self.log.run))
        return out

    def _changed(self, directory: Path) -> list[tuple[str, str]]:
        """(key, value) of the files under `directory` new or changed since the last read."""
        out: list[tuple[str, str]] = []
        for dirpath, _dirs, files in os.walk(directory):
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                try:
                    st = os.stat(path)
                    if self._seen.get(path) == (st.st_size, st.st_mtime_ns):
                        continue
                    with open(path, "rb") as f:
                        value = f.read(VALUE_BYTES).decode("utf-8", errors="replace")
                except OSError:
                    continue  # gone or unreadable now: read when it changes again
                self._seen[path] = (st.st_size, st.st_mtime_ns)
                out.append((os.path.relpath(path, directory).replace(os.sep, "/"), value))
        return out

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(path=self.path, dev=0, ino=0, fingerprint=b"", offset=0)

    def position(self) -> Checkpoint:
        return self.checkpoint()

    def close(self) -> None:
        """Nothing is held open between reads."""
