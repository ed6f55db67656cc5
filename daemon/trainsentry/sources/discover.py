"""Which files are logs, what format they are, and which run they belong to.

Run identity is a contract (DESIGN.md): a run is a directory that holds logs,
its id is its path relative to the root being read. Keras writes a run as
`train/` and `validation/` sub-directories; they are folded into the parent run
with their name as a tag prefix, so `validation/epoch_loss` sits beside
`train/epoch_loss` in one run, as TensorBoard users read it.

A file whose name carries a rank (`rank_3.jsonl`, the probe's
`trainsentry-probe.rank3.jsonl`, Slurm's `slurm-%j-%t.out`) is that rank's
run, `<run>/rank<R>`: one process's logs, a rank of the directory's job
(jobs/identity.py).

Only regular files are logs. A FIFO named `metrics.jsonl` would block the
open that reads it (and with it the daemon's one loop), a device or socket is
no log either, and a symlink to a file outside the watched roots (`ln -s
/etc/shadow run/metrics.csv`) would have the daemon read, and quote in its
warnings, what its user may read but the job's owner may not. So the walk
takes regular files and symlinks to regular files inside the roots, and says
why it leaves any other file named like a log (`refused`).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Container, Iterable
from dataclasses import dataclass
from pathlib import Path

from trainsentry.jobs import member_of, rank_in_name, ranked_run
from trainsentry.sources.checkpoint_files import (
    checkpoint_file,
    container,
    folder_by_name,
    marker,
    named_step,
    root_of,
    woken_root,
)
from trainsentry.sources.mlflow_files import metric_key, run_key, run_record, store_relative
from trainsentry.sources.mlflow_files import run_name as mlflow_run_name
from trainsentry.sources.names import safe_name
from trainsentry.sources.wandb_records import run_name as wandb_run_name

# Keras' TensorBoard callback writes one event writer per split, in these directories
# of its log_dir: such a directory is a split of the run above it, not a run (see
# run_of for when it is one all the same). TF2's tf.summary tutorial pairs a train/
# writer with a test/ one: test/ is a split only beside a train/. eval/ is a run: no
# framework's writer pairs it.
SPLIT_DIRS = frozenset({"train", "validation"})
PAIRED_SPLIT_DIRS = frozenset({"test"})

_NOT_EVENTS = (
    ".profile-empty", ".pb", ".tmp", ".py", ".md", ".txt", ".json", ".jsonl", ".yaml", ".yml",
    ".csv", ".log", ".sh", ".ipynb", ".html",
)  # fmt: skip

# Names a SQLite tracking store may have (MLflow's default is mlflow.db).
SQLITE_SUFFIXES = (".db", ".sqlite", ".sqlite3")
# What SQLite writes beside a database: a change to one is a change to the store.
_SQLITE_COMPANIONS = ("-wal", "-journal")
# Where jobs' stdout and stderr land: `train.log`, Slurm's `slurm-<job>.out`/`.err`,
# torchrun's per-rank `stdout.log`/`stderr.log`, `output.log`.
TEXT_SUFFIXES = (".log", ".out", ".err")

# Our own control files live here; never read as logs.
CONTROL_DIR = ".trainsentry"


@dataclass(frozen=True, slots=True)
class LogFile:
    path: Path
    # "tfevents" | "jsonl" | "csv" | "text" | "wandb" | "mlflow_db" | "mlflow_metric" | "mlflow_run"
    # | "checkpoints" (a directory of checkpoints: sources/checkpoints.py)
    kind: str
    run: str
    tag_prefix: str
    inside: str = ""  # the resolved root it must stay in when opened; "" for any


def refusal(path: str, inside: str) -> str | None:
    """Why the file at `path` is not read as a log (None: it is a regular file, or a
    symlink to one under the resolved directory `inside`)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None  # gone or unreadable: the tail says so itself
    if stat.S_ISREG(st.st_mode):
        return None
    if not stat.S_ISLNK(st.st_mode):
        return "not a regular file (a FIFO, socket or device is never read as a log)"
    target = os.path.realpath(path)
    if inside and not target.startswith(inside + os.sep):
        return f"a symlink to {safe_name(target)}, outside the watched roots: not read"
    try:
        return None if stat.S_ISREG(os.stat(target).st_mode) else "a symlink to no regular file"
    except OSError:
        return None


def classify(name: str) -> str | None:
    """The format of a file by its name; None for files that are not logs.

    TensorBoard event files are named `events.out.tfevents.<time>.<host>...`
    by every writer; TensorBoard itself matches "tfevents" anywhere in the
    name, and so do we, but for files whose suffix says they are something
    else: profiler traces and plugin data, and sources and notes about event
    files (`test_tfevents.py`, `tfevents.md`).
    """
    if name.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if name.endswith(".csv"):
        return "csv"
    if name.endswith(".wandb") and name.startswith("run-"):
        return "wandb"
    if name.endswith(SQLITE_SUFFIXES):
        return "mlflow_db"  # any sqlite:/// tracking URI; mlflow_db.py tells a store from others
    if name.endswith(TEXT_SUFFIXES):
        return "text"  # a job's stdout/stderr, or a CSV or JSONL one: textlog.py sniffs
    if "tfevents" in name and not name.endswith(_NOT_EVENTS):
        return "tfevents"
    return None


def is_log(path: str) -> bool:
    """Whether a changed path may be a log (for the watcher's events; describe decides)."""
    return (
        classify(os.path.basename(path)) is not None
        or metric_key(Path(path)) is not None
        or woken_root(path) is not None
    )


def store_of(path: str) -> str | None:
    """The log a changed file that is none belongs to: the database of a SQLite journal
    or WAL file, the run tail of an MLflow run's param, tag or meta.yaml, the checkpoint
    root a checkpoint's file is saved in (by names: the caller looks it up); else None."""
    for suffix in _SQLITE_COMPANIONS:
        if path.endswith(suffix):
            return path[: -len(suffix)]
    if path.endswith("meta.yaml") or "/params/" in path or "/tags/" in path:
        run_dir = run_record(Path(path))
        return str(run_key(run_dir)) if run_dir is not None else None
    return woken_root(path)


def run_directory(log: LogFile, run: str) -> Path:
    """The directory of `run`, one of the runs `log` holds: where its stop file goes.

    A file store's MLflow run has a directory of its own (`mlruns/<exp>/<run id>`);
    the runs of a SQLite store have none, so each is given the path its id names
    below the store's directory (`proj/mlflow.db`'s `proj/exp1/baseline-6b194255`),
    the layout `--control-dir` gives every run: one stop file per run, not one for
    every job of the store.
    """
    if log.kind == "mlflow_metric" and (metric := metric_key(log.path)) is not None:
        return metric[0]
    if log.kind == "mlflow_db" and run.startswith(log.run + "/"):
        return log.path.parent.joinpath(*run[len(log.run) + 1 :].split("/"))
    if log.kind == "checkpoints":  # a root is a directory: its run's (Root.checkpoints)
        return log.path.parent if container(log.path) else log.path
    directory = log.path.parent
    return directory.parent if log.tag_prefix else directory


def run_of(directory: Path, root: Path, root_name: str, top: Path | None = None) -> tuple[str, str]:
    """(run id, tag prefix) for a log file's directory under `root`.

    `root_name` names files that sit directly in the root: `run ./logs` on a
    single run directory should call it "logs", not ".". A `train/` or
    `validation/` directory is Keras' split of the run above it when that run
    is below the path given (`top`: `top/exp/train`) or the path given is
    Keras' log_dir (its `train/` has a `validation/` beside it); a lone
    `train/` directly in the path given is a run of that name, whose job finds
    its stop file in it. A `test/` beside a `train/` is the test writer of TF2's
    tf.summary tutorial, wherever it is. Judged against the path given, not against what run
    ids are named from, so `run top` and `replay top` agree.
    """
    rel = os.path.relpath(directory, root)
    parts = [] if rel == "." else [safe_name(p) for p in rel.split(os.sep)]
    prefix = ""
    below = directory.parent != (top if top is not None else root)
    if parts and _is_split(directory, below):
        prefix = parts.pop() + "/"
    if not parts:
        return safe_name(root_name), prefix
    return "/".join(parts), prefix


@dataclass(frozen=True, slots=True)
class Root:
    """A path given on the command line, and what run ids are relative to.

    `run PATH` names runs relative to PATH; `replay PATH` and `dump PATH`
    relative to PATH's parent, so a single run directory keeps its name.
    Several paths are named as `roots` says. A file given as a path is read
    as the run its directory is.
    """

    top: Path
    rel_root: Path
    name: str

    @classmethod
    def watched(cls, path: Path) -> Root:
        path = path.absolute()
        home = _home(path)
        return cls(top=path, rel_root=home, name=home.name or "root")

    @classmethod
    def under(cls, path: Path, base: Path) -> Root:
        return cls(top=path, rel_root=base, name=base.name or "root")

    @property
    def inside(self) -> str:
        """The root, resolved: where a followed symlink may lead."""
        return os.path.realpath(self.top if self.top.is_dir() else self.top.parent)

    def describe(self, path: Path) -> LogFile | None:
        kind = classify(path.name)
        if CONTROL_DIR in path.parts:
            return None
        top = self.top if self.top.is_dir() else self.top.parent
        if kind is None:
            saved_in = root_of(path, top)
            if saved_in is not None:  # a checkpoint's file: its root is the log followed
                return self.checkpoints(saved_in)
            metric = metric_key(path)
            record = run_record(path) if metric is None and path.name == "meta.yaml" else None
            run_dir = metric[0] if metric is not None else record
            if run_dir is None:
                return None
            store, _ = run_of(store_relative(run_dir), self.rel_root, self.name, top)
            run = safe_name(f"{store}/{mlflow_run_name(run_dir)}")
            if metric is None:  # the run's params, tags and status (mlflow_run.py)
                return LogFile(run_key(run_dir), "mlflow_run", run, "", inside=self.inside)
            return LogFile(path, "mlflow_metric", run, metric[1], inside=self.inside)
        directory = path.parent
        if kind == "text" and _wandb_own_log(path):
            return None
        tracked = path if kind == "wandb" else None
        if kind == "text" and directory.name == "files" and _is_wandb_run(directory.parent):
            tracked = next(iter(sorted(directory.parent.glob("run-*.wandb"))), None)
            if tracked is None:
                return None  # the job's stdout, before W&B's run file: a log once that is
        if tracked is not None:  # a W&B run, and its `files/output.log`: named as W&B names it
            named = wandb_run_name(tracked)
            if named is None:
                return None  # its run record is yet to be written: a log once it is
            if named:
                wandb_dir = tracked.parent.parent
                if wandb_dir != self.rel_root and self.rel_root not in wandb_dir.parents:
                    return LogFile(path, kind, safe_name(named), "", inside=self.inside)
                store_name, _ = run_of(wandb_dir, self.rel_root, self.name, top)
                run = safe_name(f"{store_name}/{named}")
                return LogFile(path, kind, run, "", inside=self.inside)
        if kind == "text":  # `logs/exp1.out` beside `logs/exp1/` is exp1's (docs/sources.md)
            beside = directory / path.name.rsplit(".", 1)[0]
            if beside.is_dir():
                directory = beside
        run, prefix = run_of(directory, self.rel_root, self.name, top)
        rank = rank_in_name(path.name)
        if rank is not None and not member_of(run).ranked:  # jobs/identity.py
            run = ranked_run(run, rank)
        return LogFile(path=path, kind=kind, run=run, tag_prefix=prefix, inside=self.inside)

    def checkpoints(self, root: Path) -> LogFile:
        """The log of a checkpoint root (checkpoints.py): a `checkpoints/` folder's run is
        its parent's (Lightning's `version_0/checkpoints/` is the run `version_0`, where its
        TensorBoard logs are), any other root's its own (HF's output_dir, beside its
        `runs/<date>/` logs: one job, jobs/identity.py)."""
        run_dir = root
        if container(root) and self.rel_root in root.parents:
            run_dir = root.parent
        top = self.top if self.top.is_dir() else self.top.parent
        run, _ = run_of(run_dir, self.rel_root, self.name, top)
        return LogFile(root, "checkpoints", run, "", inside=self.inside)

    def _entry_root(self, folder: Path, filenames: list[str], top: Path) -> Path | None:
        """The root of `folder` when it is a checkpoint (by its name, or a checkpoint's
        file in it) below the path given; None else."""
        if folder == top or (folder.parent != top and top not in folder.parent.parents):
            return None
        name = folder.name
        if folder_by_name(name) is not None or any(marker(name, f) for f in filenames):
            return folder.parent
        return None

    def scan(self, top: Path | None = None) -> list[LogFile]:
        """Every log file under `top` (default: the whole root), in sorted order."""
        return self.walk(top)[0]

    def walk(
        self,
        top: Path | None = None,
        errors: list[OSError] | None = None,
        known: Container[str] = (),
        refused: list[tuple[str, str]] | None = None,
    ) -> tuple[list[LogFile], int]:
        """The log files under `top` in sorted order, and how many directories were walked.

        os.walk is scandir-based: on a root of tens of thousands of run
        directories this is the startup cost, and scandir avoids a stat per
        entry. The directories it descends into are those a recursive inotify
        watch covers (less .git and our control directory), so the count tells
        the daemon whether the kernel's watch limit left some unwatched.
        A directory that cannot be listed is skipped and, given `errors`, its
        error appended there. Files whose path is in `known` (followed already)
        are left out unnamed: a sweep re-walks every run every 30 s, and naming a
        file (its run, its prefix) was half the walk. A file named like a log that
        is not one (see the module's docstring) goes to `refused` with the reason.
        """
        top = top or self.top
        inside = self.inside
        if top.is_file() or os.path.islink(top):
            found = self.describe(top)
            why = refusal(str(top), inside) if found and top != self.top else None
            if why is not None:
                if refused is not None:
                    refused.append((str(top), why))
                return [], 0
            return ([found] if found else []), 0
        out: list[LogFile] = []
        walked = 0
        given = self.top if self.top.is_dir() else self.top.parent
        roots: set[str] = set()  # checkpoint roots found in this walk: one log each

        def saved_in(root: Path) -> None:
            key = str(root)
            if key not in roots and key not in known:
                roots.add(key)
                out.append(self.checkpoints(root))

        for dirpath, dirnames, filenames in os.walk(
            top, onerror=errors.append if errors is not None else None
        ):
            walked += 1
            dirnames[:] = sorted(d for d in dirnames if d != CONTROL_DIR and d != ".git")
            base = Path(dirpath)
            # A checkpoint's files are its root's tail's to count (checkpoints.py): the
            # walk finds the root and goes no deeper into its checkpoints.
            entry_root = self._entry_root(base, filenames, given)
            if entry_root is not None:
                saved_in(entry_root)
                dirnames[:] = []
                continue
            followed = dirpath in known or dirpath in roots
            held = [
                d
                for d in dirnames
                if folder_by_name(d) is not None or (followed and named_step(d) is not None)
            ]
            if held or any(checkpoint_file(n) is not None for n in filenames):
                saved_in(base)
                dirnames[:] = [d for d in dirnames if d not in held]
            for name in sorted(filenames):
                if checkpoint_file(name) is not None:
                    continue  # a checkpoint of the root found above
                path = os.path.join(dirpath, name)
                if known and path in known:
                    continue
                found = self.describe(base / name)
                if found is None:
                    continue
                why = refusal(path, inside)
                if why is None:
                    out.append(found)
                elif refused is not None:
                    refused.append((path, why))
        return out, walked


def _is_split(directory: Path, below: bool) -> bool:
    name = directory.name
    if name in PAIRED_SPLIT_DIRS:
        return (directory.parent / "train").is_dir()
    if name not in SPLIT_DIRS:
        return False
    others = (SPLIT_DIRS | PAIRED_SPLIT_DIRS) - {name}
    return below or any((directory.parent / other).is_dir() for other in others)


def _is_wandb_run(directory: Path) -> bool:
    """A W&B run directory, by the names W&B gives it (`wandb/offline-run-*`, `wandb/run-*`):
    known before its files are written."""
    return directory.parent.name == "wandb" and directory.name.startswith(("offline-run-", "run-"))


def _wandb_own_log(path: Path) -> bool:
    """W&B's own debug logs (`wandb/debug.log`, a run's `logs/debug-internal.log`): the
    tracker's diagnostics, not the job's words; its errors (an upload that failed) would
    page as the run's."""
    if not path.name.startswith("debug"):
        return False
    directory = path.parent
    if directory.name == "wandb":  # named as W&B names them: written before the run file
        return True
    return directory.name == "logs" and _is_wandb_run(directory.parent)


def _home(path: Path) -> Path:
    """The directory a path's runs start at: a file belongs to the run of its directory."""
    return path.parent if path.is_file() else path


def roots(paths: Iterable[str | Path], *, replay: bool) -> list[Root]:
    """The roots of `run PATH ...` (replay=False) or `replay`/`dump PATH ...` (replay=True).

    One `run` root keeps naming runs relative to itself, as it always has. With
    several, `roots/A/exp` and `roots/B/exp` would both be `exp`: one run, its
    alerts mixed and its stop file written into whichever job was found first.
    So each root's runs are named under the root's own name, relative to its
    parent, as replay names them, and live and replay agree. Where two roots
    share a name (`/x/logs`, `/y/logs`), as many parent directories are kept
    as tell them apart (`x/logs/exp`, `y/logs/exp`).
    """
    given = list(dict.fromkeys(Path(p).absolute() for p in paths))
    if len(given) == 1 and not replay:
        return [Root.watched(given[0])]
    homes = [_home(p) for p in given]
    return [Root.under(p, base) for p, base in zip(given, _bases(homes), strict=True)]


def _bases(homes: list[Path]) -> list[Path]:
    """Each directory's nearest ancestor that gives it a name no other directory has."""
    depth = dict.fromkeys(homes, 1)
    while True:
        owners: dict[tuple[str, ...], set[Path]] = {}
        for home, k in depth.items():
            owners.setdefault(home.parts[-k:], set()).add(home)
        grow = [
            home
            for home, k in depth.items()
            if len(owners[home.parts[-k:]]) > 1 and k < len(home.parts) - 1
        ]
        if not grow:
            break
        for home in grow:
            depth[home] += 1
    return [home.parents[depth[home] - 1] if len(home.parts) > 1 else home for home in homes]
