"""Which file a process writes and what goes in it, by its rank; and `forward_time`,
the rank's own time in its step's first forward (probe/FORMAT.md, version 2).

The ranks here are a launcher's environment (RANK, WORLD_SIZE) without a process
group; tests/e2e/test_probe_distributed.py runs real ones. Timings are asserted
by orders of magnitude only: the machine is shared.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import Net, batches, read, read_file
from torch import nn

import trainsentry_probe
from trainsentry_probe.clock import elapsed

TIMING = {"step", "time", "probe/step_time", "probe/data_wait", "probe/forward_time", "probe/loss"}


class Sleepy(Net):
    """Net whose forward sleeps first: `sleeps` seconds per call, in call order."""

    def __init__(self, *sleeps: float) -> None:
        super().__init__()
        self.sleeps = list(sleeps)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sleeps:
            time.sleep(self.sleeps[self.calls % len(self.sleeps)])
        self.calls += 1
        return super().forward(x)


def train(model: nn.Module, logdir: Path, steps: int, loss: bool = True, **options: Any) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with trainsentry_probe.watch(model, opt, logdir, **options) as probe:
        for x, y in batches(steps):
            out = F.cross_entropy(model(x), y)
            out.backward()
            opt.step()
            opt.zero_grad()
            if loss:
                probe.record(loss=out, val_loss=1.0)


def probe_files(logdir: Path) -> list[str]:
    return sorted(p.name for p in logdir.glob("trainsentry-probe*"))


def test_a_single_process_writes_the_unranked_file_with_its_forward_time(
    tmp_path: Path,
) -> None:
    train(Sleepy(0.02), tmp_path, 5)
    assert probe_files(tmp_path) == ["trainsentry-probe.jsonl"]
    meta, records = read(tmp_path)
    assert (meta["rank"], meta["world_size"], meta["version"]) == (0, 1, 2)
    assert all(not k.startswith("rank") for r in records for k in r)
    assert all(0.8 * 0.02 <= r["probe/forward_time"] <= r["probe/step_time"] for r in records)


def test_only_the_first_forward_of_an_accumulating_step_is_timed(tmp_path: Path) -> None:
    model = Sleepy(0.0, 0.1, 0.1)  # three micro-batches a step; the later two sleep
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with trainsentry_probe.watch(model, opt, tmp_path):
        for i, (x, y) in enumerate(batches(9)):
            F.cross_entropy(model(x), y).backward()
            if i % 3 == 2:
                opt.step()
                opt.zero_grad()
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert statistics.median(r["probe/forward_time"] for r in records) < 0.05
    assert all(r["probe/step_time"] >= 0.8 * 0.2 for r in records[1:])


def test_forward_time_follows_the_step_cadence_and_leaves_evaluation_out(
    tmp_path: Path,
) -> None:
    model = Sleepy(0.1, 0.0)  # the evaluation forward before each step sleeps
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with trainsentry_probe.watch(model, opt, tmp_path, every=2):
        for x, y in batches(4):
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [0, 2]  # steps 1 and 3 record nothing
    assert all(r["probe/forward_time"] < 0.05 for r in records)


def test_a_rank_above_0_writes_its_own_file_with_timing_and_loss_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    train(Net(), tmp_path, 4, layer_every=1, sample_every=1)
    assert probe_files(tmp_path) == ["trainsentry-probe.rank1.jsonl"]
    meta, records = read_file(tmp_path / "trainsentry-probe.rank1.jsonl")
    assert (meta["kind"], meta["rank"], meta["world_size"]) == ("meta", 1, 2)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert all(r.keys() <= TIMING for r in records)
    assert all({"probe/step_time", "probe/forward_time", "probe/loss"} <= r.keys() for r in records)
    lines = (tmp_path / "trainsentry-probe.rank1.jsonl").read_text().splitlines()
    assert '"kind":"end"' in lines[-1]


def test_a_rank_above_0_hooks_no_layer_nor_backward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with trainsentry_probe.watch(model, opt, tmp_path, sample_every=1) as probe:
        assert not any(m._forward_pre_hooks for m in model.children())  # no layer order
        x, y = batches(1)[0]
        out = model(x)
        assert not out._backward_hooks and not any(m._forward_hooks for m in model.children())
        F.cross_entropy(out, y).backward()
        opt.step()
        assert probe.sampler is None and probe.failed is None
    _, records = read_file(tmp_path / "trainsentry-probe.rank3.jsonl")
    assert records[0].keys() == {"step", "time", "probe/step_time", "probe/forward_time"}


def test_with_all_ranks_a_rank_above_0_records_everything_unprefixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    train(Net(), tmp_path, 3, layer_every=1, sample_every=1, all_ranks=True)
    _, records = read_file(tmp_path / "trainsentry-probe.rank1.jsonl")
    for r in records:
        assert {"probe/grad_norm", "probe/grad_norm/fc1", "probe/lr", "probe/val_loss"} <= r.keys()
        assert {"probe/forward_time", "probe/dead_fraction/act"} <= r.keys()
        assert all(k.startswith("probe/") for k in r if k not in ("step", "time"))


class FakeEvent:
    def __init__(self, done: bool, ms: float = 0.0, broken: bool = False) -> None:
        self.done, self.ms, self.broken = done, ms, broken

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.broken:
            raise RuntimeError("cudaErrorNotReady")
        return end.ms - self.ms


def test_cuda_events_are_read_only_once_complete_and_never_waited_for() -> None:
    assert elapsed((FakeEvent(True, 1.0), FakeEvent(True, 26.0))) == pytest.approx(0.025)
    assert elapsed((FakeEvent(True), FakeEvent(False))) is None  # the value is left out
    assert elapsed((FakeEvent(False, broken=True), FakeEvent(True))) is None


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


class GpuBusy(nn.Module):
    """A forward that keeps the GPU busy ~`seconds` while the host returns at once."""

    def __init__(self, cycles: int) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.cycles = cycles

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)
        return self.fc(x)


def busy_cycles(seconds: float) -> int:
    """`torch.cuda._sleep` cycles that take about `seconds` on this GPU, measured."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10_000_000)  # clocks up
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return int(10_000_000 * seconds / (start.elapsed_time(end) / 1000))


@cuda
@pytest.mark.parametrize("rank", [0, 1])
def test_on_cuda_forward_time_is_the_device_s_time_read_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: int
) -> None:
    """The host only queues the forward's kernels: its clock would say microseconds.
    Rank 1 gives no loss, so its rows hold no device value to copy (the writer waits
    on a marker event instead)."""
    if rank:
        monkeypatch.setenv("RANK", "1")
        monkeypatch.setenv("WORLD_SIZE", "2")
    model = GpuBusy(busy_cycles(0.02)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    host = []
    with trainsentry_probe.watch(model, opt, tmp_path, transfer_every=4) as probe:
        for _ in range(8):
            x = torch.randn(16, 8, device="cuda")
            begun = time.perf_counter()
            out = model(x)
            host.append(time.perf_counter() - begun)
            out.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if rank == 0:
                probe.record(loss=out.pow(2).mean())
    name = "trainsentry-probe.rank1.jsonl" if rank else "trainsentry-probe.jsonl"
    _, records = read_file(tmp_path / name)
    forward = [r["probe/forward_time"] for r in records]
    assert len(forward) == 8
    assert statistics.median(forward) >= 0.8 * 0.02
    assert statistics.median(forward) <= 0.2
    assert statistics.median(host) < 0.5 * 0.02  # what a host clock would have said
