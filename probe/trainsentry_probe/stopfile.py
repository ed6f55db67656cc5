"""The stop file: how a critical alert reaches the training loop.

The daemon's stop action (trainsentry.actions.stop_file) writes
`<run dir>/.trainsentry/STOP`, a JSON object `{"rule", "step", "reason", ...}`,
through a temporary file and a rename. Where the daemon may not write into
run directories it runs with `--control-dir DIR` and writes
`DIR/<run id>/.trainsentry/STOP` instead; the job is pointed at that file with
the environment variable TRAINSENTRY_STOP_FILE (or the probe's `stop_file=`
option, or `control_dir=` naming the directory that holds STOP). Which file
is watched, first match wins: `stop_file=`, $TRAINSENTRY_STOP_FILE,
`<control_dir>/STOP`, `<logdir>/.trainsentry/STOP`.

Checking is one `os.stat` every `stop_every` calls of `should_stop()`: the
cadence counts calls, not optimizer steps, so every rank of a distributed job
checks at the same iterations and can agree (see `Probe.should_stop`).

A STOP file older than the probe is ignored (and said so once): it belongs to
a run that was already stopped, and a resumed run must not end at once.
The daemon never removes a stop file, so a loop that only tests whether the
file exists would end every later run in the same directory at its first
check; `StopFile` is the same check for loops without the probe, and this
module imports no torch (it is loaded only to agree across ranks), so jobs of
any framework can use it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("trainsentry_probe")

STOP_FILE = "STOP"
STOP_FILE_ENV = "TRAINSENTRY_STOP_FILE"  # the daemon's name for it, too


def stop_file_path(logdir: Path, control_dir: str | None, stop_file: str | None) -> Path:
    """The file to watch: see the module docstring for the order."""
    if stop_file:
        return Path(stop_file)
    env = os.environ.get(STOP_FILE_ENV)
    if env:
        return Path(env)
    if control_dir:
        return Path(control_dir) / STOP_FILE
    return logdir / ".trainsentry" / STOP_FILE


@dataclass(frozen=True)
class StopRequest:
    rule: str
    step: int | None
    reason: str
    path: Path


class TrainingStopped(RuntimeError):
    """Raised by `should_stop(raise_error=True)`: training was asked to stop.

    Catch it around the loop to save a checkpoint and exit cleanly."""

    def __init__(self, request: StopRequest) -> None:
        self.request = request
        at = f" at step {request.step}" if request.step is not None else ""
        super().__init__(
            f"trainsentry asked this run to stop: rule {request.rule!r}{at}: {request.reason} "
            f"({request.path})"
        )


def read_request(path: Path) -> StopRequest:
    """A stop request from the file; an unreadable or partial file still means stop."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return StopRequest("unknown", None, f"stop file unreadable: {exc}", path)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return StopRequest("unknown", None, text.strip()[:500] or "stop file present", path)
    step = data.get("step")
    return StopRequest(
        rule=str(data.get("rule") or "unknown"),
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        reason=str(data.get("reason") or data.get("message") or "no reason given"),
        path=path,
    )


class StopWatch:
    """Looks for the stop file at most once per `every` calls; remembers a hit."""

    def __init__(self, path: Path, every: int, started: float) -> None:
        self.path = path
        self.every = max(1, every)
        self.started = started
        self.calls = 0
        self.request: StopRequest | None = None
        self._stale_reported = False

    def due(self) -> bool:
        """Counts a call; whether this one looks (the first call always does)."""
        self.calls += 1
        return self.request is None and (self.calls - 1) % self.every == 0

    def look(self) -> StopRequest | None:
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError:
            return None
        if mtime < self.started - 1.0:  # 1 s of slack for coarse filesystem clocks
            if not self._stale_reported:
                self._stale_reported = True
                log.warning("trainsentry probe: ignoring %s, older than this run", self.path)
            return None
        self.request = read_request(self.path)
        return self.request


class StopFile:
    """The daemon's stop request, for a loop without the probe::

        stop = trainsentry_probe.StopFile("runs/exp1")  # when the job starts
        for batch in loader:
            ...
            if stop.requested():
                save_checkpoint()
                break

    The file is looked for where the probe would look (`stop_file=`,
    $TRAINSENTRY_STOP_FILE, `<control_dir>/STOP`, `<logdir>/.trainsentry/STOP`),
    with one `os.stat` every `every` calls. A file older than this object (by
    more than a second) is a past run's and ignored; one written later, even
    unreadable, is a request, and stays one. Single process: distributed ranks
    must agree on stopping, which `Probe.should_stop()` does for them.
    """

    def __init__(
        self,
        logdir: str | Path,
        *,
        stop_file: str | None = None,
        control_dir: str | None = None,
        every: int = 1,
    ) -> None:
        path = stop_file_path(Path(logdir), control_dir, stop_file)
        self._watch = StopWatch(path, every, started=time.time())

    @property
    def path(self) -> Path:
        return self._watch.path

    def requested(self) -> StopRequest | None:
        """The request (rule, step, reason) once a fresh stop file was seen, else None."""
        if self._watch.due():
            self._watch.look()
        return self._watch.request


def agree_across_ranks(request: StopRequest | None, watch: StopWatch) -> StopRequest | None:
    """All ranks stop if any saw the file (one all_reduce, only on checking calls):
    a rank that stops alone leaves the others waiting in their next collective."""
    import torch  # here only: the rest of this module serves loops without torch

    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return request
    nccl = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    flag = torch.tensor([1.0 if request is not None else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() > 0 and request is None:
        request = StopRequest("unknown", None, "another rank saw the stop file", watch.path)
        watch.request = request
    return request
