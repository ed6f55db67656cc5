"""The probe in a real two-process torch.distributed job (gloo, on the CPU,
rendezvous on 127.0.0.1): which ranks record, what they say about themselves,
and that DDP's gradients are measured after the all-reduce."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = """
import json, sys
import torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
import trainsentry_probe

logdir, all_ranks = sys.argv[1], sys.argv[2] == "all"
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
probe = trainsentry_probe.watch(ddp, opt, logdir, all_ranks=all_ranks, layer_every=1)
g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
norms = []
for step in range(4):
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
    loss = F.cross_entropy(ddp(x), y)
    loss.backward()
    norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
    opt.step()
    opt.zero_grad()
    probe.record(loss=loss)
    probe.should_stop()  # a collective on checking calls: every rank calls it
probe.close()
with open(f"{logdir}/seen.rank{rank}.json", "w") as out:
    json.dump({"norms": norms, "failed": repr(probe.failed)}, out)
# Without the barrier, a rank that tears gloo down while its peer is still
# finishing makes the peer's gloo thread call std::terminate (about 1 run in 6
# here, with or without the probe).
dist.barrier()
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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


def run_job(tmp_path: Path, ranks: str) -> Path:
    logdir = tmp_path / ranks
    logdir.mkdir()
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    run_ranks(script, str(logdir), ranks)
    return logdir


def read(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return records[0], records[1:]


def seen(logdir: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((logdir / f"seen.rank{rank}.json").read_text())
    assert data["failed"] == "None"
    return data


def test_by_default_only_rank_0_records(tmp_path: Path) -> None:
    logdir = run_job(tmp_path, "rank0")
    assert sorted(p.name for p in logdir.glob("trainsentry-probe.*")) == [
        "trainsentry-probe.rank0.jsonl"
    ]
    meta, records = read(logdir / "trainsentry-probe.rank0.jsonl")
    assert (meta["rank"], meta["world_size"]) == (0, 2)
    assert meta["layers"] == ["0", "2"]  # DDP's `module.` is not part of the names
    assert [r["probe/grad_norm"] for r in records] == pytest.approx(
        seen(logdir, 0)["norms"], rel=1e-5
    )


def test_with_all_ranks_each_rank_writes_its_own_file_and_ddp_norms_agree(
    tmp_path: Path,
) -> None:
    logdir = run_job(tmp_path, "all")
    meta0, rank0 = read(logdir / "trainsentry-probe.rank0.jsonl")
    meta1, rank1 = read(logdir / "trainsentry-probe.rank1.jsonl")
    assert [(m["rank"], m["world_size"]) for m in (meta0, meta1)] == [(0, 2), (1, 2)]
    assert meta0["pid"] != meta1["pid"]
    assert {k for k in rank1[0] if "/" in k} and all(
        k.startswith("rank1/probe/") for k in rank1[0] if "/" in k
    )
    # each rank's own batches, so the losses differ ...
    assert rank0[0]["probe/loss"] != rank1[0]["rank1/probe/loss"]
    # ... but the norms are of DDP's averaged gradients: taken after its all-reduce
    norms0 = [r["probe/grad_norm"] for r in rank0]
    norms1 = [r["rank1/probe/grad_norm"] for r in rank1]
    assert norms0 == pytest.approx(norms1, rel=1e-6)
    assert norms0 == pytest.approx(seen(logdir, 0)["norms"], rel=1e-5)
    assert norms1 == pytest.approx(seen(logdir, 1)["norms"], rel=1e-5)
    layer0 = [r["probe/grad_norm/2"] for r in rank0]
    assert layer0 == pytest.approx([r["rank1/probe/grad_norm/2"] for r in rank1], rel=1e-6)
