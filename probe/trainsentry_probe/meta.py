"""The meta record: the run's trace, written first in every probe file.

When an alert fires at 3 a.m. the first questions are which code, which
machine, which seed and which settings; the meta record answers them without
access to the job. It is gathered on the writer thread (the git calls may
take a moment in a large repository) so `watch()` returns at once.
"""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import time
import uuid
from typing import Any

import torch

from trainsentry_probe.records import RECORD_FORMAT, RECORD_FORMAT_VERSION
from trainsentry_probe.stopfile import TrainingStopped


def rank_and_world_size() -> tuple[int, int]:
    """torch.distributed's view when initialised, else the launcher's environment
    (torchrun, Lightning, accelerate and SLURM wrappers all set RANK/WORLD_SIZE)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()

    def env_int(*names: str, default: int) -> int:
        for name in names:
            try:
                return int(os.environ[name])
            except (KeyError, ValueError):
                continue
        return default

    return env_int("RANK", "SLURM_PROCID", default=0), env_int(
        "WORLD_SIZE", "SLURM_NTASKS", default=1
    )


def git_state(directory: str) -> dict[str, Any] | None:
    """Commit and dirtiness of the working directory's repository; None outside one."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", "-C", directory, *args], capture_output=True, text=True, timeout=5
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if not commit:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """What tells this process from a later one given the same pid: its start time in
    clock ticks since boot (field 22 of /proc/<pid>/stat) and its pid namespace (a
    daemon in a container with the host's name sees other pids). Empty off Linux."""
    where = f"/proc/{pid if pid is not None else 'self'}"
    try:
        with open(f"{where}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        namespace = os.readlink(f"{where}/ns/pid")
    except (OSError, IndexError):
        return {}
    return {"pid_start": int(fields[19]), "pid_ns": namespace}


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


def meta_record(
    *,
    run_id: str,
    logdir: str,
    rank: int,
    world_size: int,
    device: torch.device,
    seed: int | None,
    hparams: dict[str, Any],
    options: dict[str, Any],
    layers: list[str],
) -> dict[str, Any]:
    device_name = None
    if device.type == "cuda" and torch.cuda.is_available():
        try:
            device_name = torch.cuda.get_device_name(device)
        except Exception:  # a broken driver must not stop the meta record
            device_name = None
    return {
        "kind": "meta",
        "format": RECORD_FORMAT,
        "version": RECORD_FORMAT_VERSION,
        "time": time.time(),
        "run_id": run_id,
        "logdir": logdir,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        **process_identity(),
        "rank": rank,
        "world_size": world_size,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "device_name": device_name,
        "git": git_state(os.getcwd()),
        "seed": seed if seed is not None else torch.initial_seed(),
        "hparams": hparams,
        "options": options,
        "layers": layers,
    }


def end_record(step: int, error: BaseException | None) -> dict[str, Any]:
    """The last record of a probe file, written at a clean close or an exception the
    probe was told of: without it a process that is gone died (probe/FORMAT.md).
    `sys.exit(0)` and a stop the daemon asked for (TrainingStopped) end a run cleanly."""
    if isinstance(error, TrainingStopped) or (
        isinstance(error, SystemExit) and error.code in (0, None)
    ):
        error = None
    record: dict[str, Any] = {
        "kind": "end",
        "format": RECORD_FORMAT,
        "version": RECORD_FORMAT_VERSION,
        "time": time.time(),
        "step": step,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "exit": "clean" if error is None else "exception",
    }
    if error is not None:
        text = str(error).strip().splitlines()
        record["error"] = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    return record
