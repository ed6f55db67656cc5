"""The probe in a real two-process torch.distributed job (gloo, on the CPU,
rendezvous on 127.0.0.1): what each rank writes, what they say about themselves,
that DDP's gradients are measured after the all-reduce, and that each rank's
own time (data wait, forward) shows which rank the others wait for."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from support.probe_loops import read_file
from support.ranks import run_ranks

WORKER = """
import json, sys, time
import torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
import trainsentry_probe

logdir, mode = sys.argv[1], sys.argv[2]
all_ranks, slow = mode == "all", mode == "slow"
dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank = dist.get_rank()
FORWARD_SLEEP, DATA_SLEEP = (0.05, 0.2) if slow and rank == 1 else (0.0, 0.0)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        time.sleep(FORWARD_SLEEP)  # rank 1 of the "slow" job: a slow forward
        return self.layers(x)

torch.manual_seed(0)
model = Net()
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
probe = trainsentry_probe.watch(ddp, opt, logdir, all_ranks=all_ranks, layer_every=1)
g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
norms = []
for step in range(8 if slow else 4):
    time.sleep(DATA_SLEEP)  # rank 1 of the "slow" job: a slow data loader
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


def run_job(tmp_path: Path, mode: str, worker: str = WORKER) -> Path:
    """Both ranks of `worker` on a log dir of their own; `mode`: the worker's argument."""
    logdir = tmp_path / mode
    logdir.mkdir()
    script = tmp_path / f"worker-{mode}.py"
    script.write_text(worker)
    run_ranks(script, str(logdir), mode)
    return logdir


def seen(logdir: Path, rank: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((logdir / f"seen.rank{rank}.json").read_text())
    assert data["failed"] == "None"
    return data


TIMING = {"step", "time", "probe/step_time", "probe/data_wait", "probe/forward_time", "probe/loss"}


def ended_cleanly(path: Path) -> bool:
    last = json.loads(path.read_text().splitlines()[-1])
    return bool(last["kind"] == "end" and last["exit"] == "clean")


def test_by_default_rank_0_records_everything_and_rank_1_its_timing_and_loss(
    tmp_path: Path,
) -> None:
    logdir = run_job(tmp_path, "default")
    assert sorted(p.name for p in logdir.glob("trainsentry-probe*")) == [
        "trainsentry-probe.rank0.jsonl",
        "trainsentry-probe.rank1.jsonl",
    ]
    meta, records = read_file(logdir / "trainsentry-probe.rank0.jsonl")
    assert (meta["rank"], meta["world_size"]) == (0, 2)
    assert meta["layers"] == ["layers.0", "layers.2"]  # DDP's `module.` is left out
    assert [r["probe/grad_norm"] for r in records] == pytest.approx(
        seen(logdir, 0)["norms"], rel=1e-5
    )
    assert all("probe/grad_norm/layers.2" in r and "probe/lr" in r for r in records)
    meta1, rank1 = read_file(logdir / "trainsentry-probe.rank1.jsonl")
    assert (meta1["rank"], meta1["world_size"]) == (1, 2) and meta1["pid"] != meta["pid"]
    assert [r["step"] for r in rank1] == [0, 1, 2, 3]
    assert all(r.keys() <= TIMING for r in rank1)  # no rank<R>/ prefix, no norms
    assert all({"probe/step_time", "probe/forward_time", "probe/loss"} <= r.keys() for r in rank1)
    assert all("probe/data_wait" in r for r in rank1[1:])  # from the second step on
    assert rank1[0]["probe/loss"] != records[0]["probe/loss"]  # rank 1's own batches
    assert ended_cleanly(logdir / "trainsentry-probe.rank0.jsonl")
    assert ended_cleanly(logdir / "trainsentry-probe.rank1.jsonl")


@pytest.fixture(scope="module")
def slow_rank_1(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """A job whose rank 1 sleeps 50 ms in every forward and 200 ms loading every batch."""
    logdir = run_job(tmp_path_factory.mktemp("slow"), "slow")
    return {r: read_file(logdir / f"trainsentry-probe.rank{r}.jsonl")[1] for r in (0, 1)}


def median(records: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[f"probe/{key}"] for r in records if f"probe/{key}" in r)


def test_a_rank_with_a_slow_forward_shows_it_in_its_forward_time(
    slow_rank_1: dict[int, list[dict[str, Any]]],
) -> None:
    """DDP's all-reduce in backward makes rank 0 wait for rank 1: rank 0's step time
    grows too, but its own forward does not."""
    fast, slow = median(slow_rank_1[0], "forward_time"), median(slow_rank_1[1], "forward_time")
    assert slow - fast >= 0.8 * 0.05
    assert slow < 0.8 * 0.2  # the loader's sleep is not the forward's
    assert median(slow_rank_1[0], "step_time") >= 0.8 * 0.25  # rank 0 waited


def test_a_rank_with_a_slow_data_loader_shows_it_in_its_data_wait(
    slow_rank_1: dict[int, list[dict[str, Any]]],
) -> None:
    fast, slow = median(slow_rank_1[0], "data_wait"), median(slow_rank_1[1], "data_wait")
    assert slow - fast >= 0.8 * 0.2
    assert fast < 0.8 * 0.2


def test_with_all_ranks_every_rank_records_everything_and_ddp_norms_agree(
    tmp_path: Path,
) -> None:
    logdir = run_job(tmp_path, "all")
    meta0, rank0 = read_file(logdir / "trainsentry-probe.rank0.jsonl")
    meta1, rank1 = read_file(logdir / "trainsentry-probe.rank1.jsonl")
    assert [(m["rank"], m["world_size"]) for m in (meta0, meta1)] == [(0, 2), (1, 2)]
    assert meta0["pid"] != meta1["pid"]
    assert {k for k in rank1[0] if "/" in k} and all(
        k.startswith("probe/") for r in rank1 for k in r if "/" in k
    )
    assert all("probe/grad_norm/layers.0" in r and "probe/lr" in r for r in rank1)
    # each rank's own batches, so the losses differ ...
    assert rank0[0]["probe/loss"] != rank1[0]["probe/loss"]
    # ... but the norms are of DDP's averaged gradients: taken after its all-reduce
    norms0 = [r["probe/grad_norm"] for r in rank0]
    norms1 = [r["probe/grad_norm"] for r in rank1]
    assert norms0 == pytest.approx(norms1, rel=1e-6)
    assert norms0 == pytest.approx(seen(logdir, 0)["norms"], rel=1e-5)
    assert norms1 == pytest.approx(seen(logdir, 1)["norms"], rel=1e-5)
    layer0 = [r["probe/grad_norm/layers.2"] for r in rank0]
    assert layer0 == pytest.approx([r["probe/grad_norm/layers.2"] for r in rank1], rel=1e-6)


FSDP_WORKER = """
import json, sys
import torch, torch.distributed as dist, torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
import trainsentry_probe

logdir, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 5))  # 5 rows: uneven shards
mesh = init_device_mesh("cpu", (2,))
for layer in (model[0], model[2]):
    fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
probe = trainsentry_probe.watch(model, opt, logdir, layer_every=2)
if mode == "fail" and rank == 1:  # rank 1's probe breaks at step 3: the job must go on
    take = probe.steps.take_gradients
    def broken(row, optimizer):
        if row.step == 3:
            raise RuntimeError("injected")
        take(row, optimizer)
    probe.steps.take_gradients = broken

def full(tensors):
    return sum(float(t.full_tensor().norm()) ** 2 for t in tensors) ** 0.5

g = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
norms, layers, weights = [], [], []
for step in range(6):
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 5, (16,), generator=g)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    norms.append(float(total.full_tensor() if isinstance(total, DTensor) else total))
    layers.append([full(p.grad for p in model[i].parameters()) for i in (0, 2)])
    opt.step()
    weights.append([full(model[i].parameters()) for i in (0, 2)])
    opt.zero_grad()
    probe.record(loss=loss)
probe.close()
with open(f"{logdir}/seen.rank{rank}.json", "w") as out:
    json.dump({"norms": norms, "layers": layers, "weights": weights,
               "failed": repr(probe.failed)}, out)
dist.barrier()
dist.destroy_process_group()
"""


def test_a_sharded_model_s_norms_are_the_whole_model_s_on_rank_0(tmp_path: Path) -> None:
    """FSDP2: each rank holds a shard of every weight and gradient; the probe's norms
    are those of the whole model (clip_grad_norm_'s), not rank 0's shards'."""
    logdir = run_job(tmp_path, "plain", FSDP_WORKER)
    assert sorted(p.name for p in logdir.glob("trainsentry-probe*")) == [
        "trainsentry-probe.rank0.jsonl",
        "trainsentry-probe.rank1.jsonl",
    ]
    _, rank1 = read_file(logdir / "trainsentry-probe.rank1.jsonl")
    assert [r["step"] for r in rank1] == list(range(6))  # it took its shards' norms ...
    assert all(r.keys() <= TIMING and "probe/loss" in r for r in rank1)  # ... and wrote none
    meta, records = read_file(logdir / "trainsentry-probe.rank0.jsonl")
    assert (meta["rank"], meta["world_size"]) == (0, 2)
    truth = seen(logdir, 0)
    assert [r["probe/grad_norm"] for r in records] == pytest.approx(truth["norms"], rel=1e-5)
    for r, layers, weights in zip(records, truth["layers"], truth["weights"], strict=True):
        if r["step"] % 2:  # per-layer statistics every 2 steps
            assert "probe/grad_norm/0" not in r and "probe/param_norm/0" not in r
            continue
        assert [r["probe/grad_norm/0"], r["probe/grad_norm/2"]] == pytest.approx(layers, rel=1e-5)
        assert [r["probe/param_norm/0"], r["probe/param_norm/2"]] == pytest.approx(
            weights, rel=1e-5
        )
        assert 0 < r["probe/update_ratio"] < 1
    assert all(r["probe/nonfinite_grads"] == 0 for r in records)


def test_a_rank_whose_probe_fails_leaves_the_job_running_and_no_shard_norm_written(
    tmp_path: Path,
) -> None:
    """The ranks' sums are a collective: a rank that stopped taking part would hang the
    others. The failed one keeps taking part with a flag, and from that step on rank 0
    writes no gradient or weight norm (a shard's would pass for the model's)."""
    logdir = run_job(tmp_path, "fail", FSDP_WORKER)  # both ranks exited 0: nobody hung
    assert "injected" in json.loads((logdir / "seen.rank1.json").read_text())["failed"]
    _, records = read_file(logdir / "trainsentry-probe.rank0.jsonl")
    assert [r["step"] for r in records] == list(range(6))
    truth = seen(logdir, 0)
    before = [r for r in records if r["step"] < 3]
    assert [r["probe/grad_norm"] for r in before] == pytest.approx(truth["norms"][:3], rel=1e-5)
    after = [r for r in records if r["step"] >= 3]
    assert all("probe/loss" in r for r in after)
    assert not [k for r in after for k in r if "norm" in k or "update_ratio" in k]
