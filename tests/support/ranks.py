"""A script run as both ranks of a two-process torch.distributed job on this machine.

The probe's distributed behaviour (who records, where files go, which
gradients are measured) only shows with real ranks: two processes meeting
through env:// on 127.0.0.1, as torchrun would start them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.ports import free_port


def run_ranks(script: Path, *args: str) -> None:
    """Runs `script ARGS...` as both ranks of a job (env:// rendezvous on 127.0.0.1)."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank))
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        outputs = [p.communicate(timeout=100)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, output in zip(procs, outputs, strict=True):
        assert p.returncode == 0, output
