"""Which job a run belongs to, and which rank and attempt of it the run is.

A run is one process's logs; a job is the runs that belong together: the
ranks of one launch and the attempts of one job across restarts. What tells
them apart is written in the paths the launchers and jobs already use, so a
run's place in its job is a pure function of its id (the path relative to the
watched root), the same for `run`, `replay` and every daemon of a fleet:

- torchrun's `--log-dir`: `<dir>/<rdzv id>_<random>/attempt_<N>/<local rank>/`
  (stdout.log, stderr.log, error.json). The random suffix is mkdtemp's, one per
  agent (one per node and launch); the job is `<dir>/<rdzv id>`, so the agents
  of one multi-node job and the relaunches of a requeued one (`--rdzv-id
  $SLURM_JOB_ID`) are one job. torchrun's default id, `none`, is shared by
  unrelated jobs: there the agent's own directory is the job.
- a rank in a name: `rank3/`, `rank_3.jsonl`, `metrics.rank-3.log`, the
  probe's `trainsentry-probe.rank3.jsonl`, Slurm's `%t` in `slurm-%j-%t.out`.
  sources/discover.py names such a file's run `<run>/rank<R>`, so every rank
  of every layout ends in this one form.
- an attempt in a name: `attempt_2/`, `attempt-2/`.

`group` is the directory whose ranks are compared with one another (one
attempt of one launch); `job` is what pages once per incident and what a
fleet's Prometheus joins on. A run that is no rank of anything is a job of
its own (`job == run`), as it always was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# a rank as a path component or in a file's name: rank3, rank_3, rank-3, rank.3 (any case)
_RANK_COMPONENT = re.compile(r"^rank[_.-]?(\d{1,6})$", re.IGNORECASE)
_RANK_IN_NAME = re.compile(r"(?:^|[._-])rank[_.-]?(\d+)(?=[._-]|$)", re.IGNORECASE)
# Slurm's per-task output, `--output=slurm-%j-%t.out` (or `.%t`); an array's default
# `slurm-%A_%a.out` names array tasks, which are jobs of their own, with an underscore
_SLURM_TASK = re.compile(r"^slurm-(\d+)[.-](\d+)\.(?:out|err|log)$")
# torch.distributed's excepthook marks each line of an uncaught exception `[rank<global
# rank>]:`, torchrun's `--tee` each line of a worker `[default<local rank>]:` (the role
# and local rank): grouping a text log into events and quoting one look past it, and a
# log of many ranks' lines (a Slurm job's output) gives each line to its rank's run.
RANK_PREFIX = re.compile(r"^\[(?:rank|default)(\d{1,6})\]:\s?")
_ATTEMPT = re.compile(r"^attempt[_-]?(\d{1,6})$")
# mkdtemp's suffix, as torchrun's agent names its log directory `<rdzv id>_<8 random>`
_AGENT_DIR = re.compile(r"^(.+)_([a-z0-9_]{8})$")
TORCHRUN_DEFAULT_ID = "none"
# a rank number beyond any real job's (the largest runs on record have ~10^5 ranks):
# a file claiming rank 10^9 is named so, but is no rank of a job
MAX_RANK = 999_999
# Ranks of one group compared with one another (rules/ranks.py): the first this many; a
# job of more is read and judged rank by rank like any run, its ranks not compared.
MAX_RANKS_COMPARED = 4096


@dataclass(frozen=True, slots=True)
class Member:
    """A run's place in its job. `rank` and `attempt` are None where nothing says them."""

    job: str
    group: str  # the directory holding the ranks compared with one another
    rank: int | None = None
    attempt: int | None = None
    agent: str = ""  # torchrun's agent directory suffix: one launch on one node

    @property
    def ranked(self) -> bool:
        return self.rank is not None

    def keys(self) -> dict[str, object]:
        """The keys a point or alert line adds (DESIGN.md): the job always, the rank and
        attempt where known."""
        out: dict[str, object] = {"job": self.job}
        if self.rank is not None:
            out["rank"] = self.rank
        if self.attempt is not None:
            out["attempt"] = self.attempt
        return out


def _claimed(name: str) -> str | None:
    """The digits of the rank a file's name claims (`rank_3.jsonl`, `slurm-123-3.out`)."""
    slurm = _SLURM_TASK.match(name)
    if slurm is not None:
        return slurm.group(2)
    found = _RANK_IN_NAME.search(name)
    return found.group(1) if found is not None else None


def rank_in_name(name: str) -> int | None:
    """The rank a log file's name carries, else None (also for a rank past MAX_RANK)."""
    claimed = _claimed(name)
    return _bounded(claimed) if claimed is not None else None


def rank_refused(name: str) -> str | None:
    """Why a file's name that claims a rank is read as no rank's (None: it claims none, or
    one within bounds)."""
    claimed = _claimed(name)
    if claimed is None or _bounded(claimed) is not None:
        return None
    shown = claimed if len(claimed) <= 12 else f"{claimed[:12]}..."
    return (
        f"names rank {shown}, beyond the {MAX_RANK:,} a job has at most: read as a run of"
        " its own, no rank of a job"
    )


def rank_of_line(line: str) -> int | None:
    """The rank a line's prefix names (`[rank3]: ...`, `[default3]: ...`), else None."""
    if not line.startswith("["):
        return None
    found = RANK_PREFIX.match(line)
    return int(found.group(1)) if found is not None else None


def ranked_run(run: str, rank: int) -> str:
    """The id of rank `rank`'s run among the logs of `run`'s directory."""
    return f"{run}/rank{rank}"


@lru_cache(maxsize=65536)
def member_of(run: str) -> Member:
    """The job, rank and attempt a run id says (see the module)."""
    parts = run.split("/")
    rank: int | None = None
    if len(parts) >= 3 and parts[-1].isdigit() and _ATTEMPT.match(parts[-2]):
        rank = _bounded(parts[-1])  # torchrun: attempt_<N>/<local rank>
        parts = parts[:-1]
    elif len(parts) > 1 and (found := _RANK_COMPONENT.match(parts[-1])) is not None:
        rank = _bounded(found.group(1))
        parts = parts[:-1]
    group = "/".join(parts)
    attempt: int | None = None
    agent = ""
    if len(parts) > 1 and (found := _ATTEMPT.match(parts[-1])) is not None:
        attempt = int(found.group(1))
        parts = parts[:-1]
        agent_dir = _AGENT_DIR.match(parts[-1])  # only above an attempt: torchrun's layout
        if agent_dir is not None and agent_dir.group(1) != TORCHRUN_DEFAULT_ID:
            agent = agent_dir.group(2)
            parts = [*parts[:-1], agent_dir.group(1)]
    if rank is None and attempt is None:
        return Member(job=run, group=run)
    return Member(job="/".join(parts), group=group, rank=rank, attempt=attempt, agent=agent)


def job_of(run: str) -> str:
    return member_of(run).job


def same_job(run: str, other: str) -> bool:
    """Whether two runs are one job's, so their alerts make one incident.

    The ranks and attempts of a job are one job (see the module). Beyond that,
    run ids are directory paths, and a job that writes with two loggers puts
    one log inside the other's directory: Keras' CSVLogger in the job's
    directory beside the TensorBoard callback's `logs/`, a Slurm output above
    the job's MLflow store. A job and the runs below it are one job; siblings
    (`sweep/a`, `sweep/b`) are not.
    """
    if run == other:
        return True
    a, b = job_of(run), job_of(other)
    if a == b:
        return True
    inner, outer = (a, b) if len(a) > len(b) else (b, a)
    return inner.startswith(outer) and inner[len(outer)] == "/"


def _bounded(digits: str) -> int | None:
    if len(digits) > len(str(MAX_RANK)):  # int() of a 10^5-digit name would cost seconds
        return None
    rank = int(digits)
    return rank if rank <= MAX_RANK else None
