"""The probe on real (tiny) torch training loops on the CPU: records, statistics
against straightforward reference computations, safety, stop files."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainsentry_probe
from trainsentry_probe import TrainingStopped, gradients
from trainsentry_probe.gpu import NvmlSampler


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 16)
        self.squash = nn.Tanh()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.squash(self.fc2(self.act(self.fc1(x)))))


def batches(n: int, seed: int = 0, size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 8, generator=g), torch.randint(0, 4, (size,), generator=g))
        for _ in range(n)
    ]


def read(logdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = (logdir / "trainsentry-probe.rank0.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    return records[0], records[1:]


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for r in records:
        out.setdefault(r["step"], {}).update(r)
    return out


def layer_norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().norm()) ** 2 for t in tensors))


def test_plain_loop_writes_a_meta_record_then_one_record_per_step(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with trainsentry_probe.watch(
        model,
        opt,
        tmp_path,
        layer_every=5,
        sample_every=10,
        hparams={"lr": 0.05},
        seed=7,
        run_id="r1",
    ) as probe:
        for x, y in batches(12):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            probe.record(loss=loss)
    meta, records = read(tmp_path)
    assert meta["kind"] == "meta" and meta["format"] == "trainsentry-probe"
    assert meta["version"] == trainsentry_probe.RECORD_FORMAT_VERSION
    assert (meta["run_id"], meta["rank"], meta["world_size"], meta["seed"]) == ("r1", 0, 1, 7)
    assert meta["hparams"] == {"lr": 0.05} and meta["torch"] == torch.__version__
    assert meta["layers"] == ["fc1", "fc2", "head"] and "pid" in meta and "host" in meta
    assert [r["step"] for r in records] == list(range(12))
    for r in records:
        assert {
            "probe/loss",
            "probe/lr",
            "probe/grad_norm",
            "probe/step_time",
            "probe/nonfinite_grads",
            "probe/samples_per_second",
            "time",
        } <= r.keys()
        assert r["probe/nonfinite_grads"] == 0 and r["probe/lr"] == 0.05
        assert ("probe/grad_norm/fc1" in r) == (r["step"] % 5 == 0)
        assert ("probe/update_ratio/fc2" in r) == (r["step"] % 5 == 0)
        assert ("probe/dead_fraction/act" in r) == (r["step"] % 10 == 0)
        assert ("probe/saturation/squash" in r) == (r["step"] % 10 == 0)
    assert all("probe/data_wait" in r for r in records[1:])
    assert "probe/param_norm/head" in records[5] and "probe/grad_concentration" in records[5]


def test_per_layer_gradient_norms_equal_a_direct_reference(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = Net()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    expected: dict[int, dict[str, float]] = {}
    probe = trainsentry_probe.watch(model, opt, tmp_path, layer_every=3)
    for step, (x, y) in enumerate(batches(7)):
        F.cross_entropy(model(x), y).backward()
        expected[step] = {
            name: layer_norm([p.grad for p in m.parameters()])  # type: ignore[misc]
            for name, m in (("fc1", model.fc1), ("fc2", model.fc2), ("head", model.head))
        }
        expected[step]["total"] = layer_norm([p.grad for p in model.parameters()])  # type: ignore[misc]
        opt.step()
        opt.zero_grad()
    probe.close()
    _, records = read(tmp_path)
    for r in records:
        assert r["probe/grad_norm"] == pytest.approx(expected[r["step"]]["total"], rel=1e-5)
    for step in (0, 3, 6):
        r = records[step]
        norms = [expected[step][n] for n in ("fc1", "fc2", "head")]
        for name, want in zip(("fc1", "fc2", "head"), norms, strict=True):
            assert r[f"probe/grad_norm/{name}"] == pytest.approx(want, rel=1e-5)
        median = sorted(norms)[1]
        assert r["probe/grad_concentration"] == pytest.approx(max(norms) / median, rel=1e-5)


def test_gradient_norms_are_taken_before_clipping(tmp_path: Path) -> None:
    torch.manual_seed(6)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    returned = []
    with trainsentry_probe.watch(model, opt, tmp_path, layer_every=1) as probe:
        for x, y in batches(3):
            (F.cross_entropy(model(x), y) * 1000).backward()
            returned.append(float(nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
            opt.step()
            opt.zero_grad()
            probe.record()
    _, records = read(tmp_path)
    assert [r["probe/grad_norm"] for r in records] == pytest.approx(returned, rel=1e-5)
    assert all(r > 1 for r in returned)


def test_update_ratio_is_the_weight_change_over_the_weight_norm(tmp_path: Path) -> None:
    torch.manual_seed(2)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)
    expected: dict[int, dict[str, float]] = {}
    probe = trainsentry_probe.watch(model, opt, tmp_path, layer_every=2)
    for step, (x, y) in enumerate(batches(5)):
        F.cross_entropy(model(x), y).backward()
        before = {
            n: [p.detach().clone() for p in m.parameters()]
            for n, m in (("fc1", model.fc1), ("head", model.head))
        }
        opt.step()
        opt.zero_grad()
        expected[step] = {
            n: layer_norm([a.detach() - b for a, b in zip(m.parameters(), before[n], strict=True)])
            / layer_norm(before[n])
            for n, m in (("fc1", model.fc1), ("head", model.head))
        }
    probe.close()
    _, records = read(tmp_path)
    for step in (0, 2, 4):
        for name in ("fc1", "head"):
            got = records[step][f"probe/update_ratio/{name}"]
            assert got == pytest.approx(expected[step][name], rel=1e-4)
    assert "probe/update_ratio" in records[0] and "probe/update_ratio/fc1" not in records[1]


def test_update_ratios_of_large_layers_are_estimated_closely_from_a_sample(
    tmp_path: Path,
) -> None:
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 4, (64,))
    with trainsentry_probe.watch(model, opt, tmp_path, layer_every=1, update_sample=4096):
        F.cross_entropy(model(x), y).backward()
        before = model[0].weight.detach().clone()
        opt.step()
    exact = float((model[0].weight.detach() - before).norm() / before.norm())
    _, records = read(tmp_path)
    assert records[0]["probe/update_ratio/0"] == pytest.approx(exact, rel=0.05)


def test_a_layer_left_out_of_the_optimizer_shows_a_zero_update_ratio(tmp_path: Path) -> None:
    model = Net()
    trained = [p for n, p in model.named_parameters() if not n.startswith("fc2")]
    opt = torch.optim.SGD(trained, lr=0.1)
    with trainsentry_probe.watch(model, opt, tmp_path, layer_every=1) as probe:
        for x, y in batches(2):
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            probe.record()
    _, records = read(tmp_path)
    assert records[1]["probe/update_ratio/fc2"] == 0.0
    assert records[1]["probe/update_ratio/fc1"] > 0 and records[1]["probe/grad_norm/fc2"] > 0


def test_a_nan_injected_into_one_layer_gradient_names_that_layer(tmp_path: Path) -> None:
    torch.manual_seed(3)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(model, opt, tmp_path, layer_every=4)
    for step, (x, y) in enumerate(batches(6)):
        handle = None
        if step in (2, 4):  # step 2: a step without layer statistics; 4: with
            handle = model.fc2.weight.register_hook(lambda g: g * float("nan"))
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        if handle is not None:
            handle.remove()
            with torch.no_grad():  # undo the poisoned update so later steps stay finite
                model.fc2.weight.nan_to_num_(0.0)
    probe.close()
    _, records = read(tmp_path)
    for step in (2, 4):
        r = records[step]
        assert r["probe/nonfinite_grads"] == 1 and r["probe/first_nonfinite"] == "fc2"
        assert math.isnan(r["probe/grad_norm"])
    assert math.isnan(records[4]["probe/grad_norm/fc2"])
    assert math.isfinite(records[4]["probe/grad_norm/fc1"])
    assert records[3]["probe/nonfinite_grads"] == 0 and "probe/first_nonfinite" not in records[3]


def test_a_non_finite_gradient_in_several_layers_names_the_one_nearest_the_output(
    tmp_path: Path,
) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(model, opt, tmp_path, layer_every=1)
    x, y = batches(1)[0]
    model.fc1.bias.register_hook(lambda g: g * float("inf"))
    model.fc2.bias.register_hook(lambda g: g * float("nan"))
    F.cross_entropy(model(x), y).backward()
    opt.step()
    probe.close()
    _, records = read(tmp_path)
    assert records[0]["probe/nonfinite_grads"] == 2
    assert records[0]["probe/first_nonfinite"] == "fc2"  # backward reaches fc2 before fc1


def test_relus_behind_a_large_negative_bias_are_all_dead(tmp_path: Path) -> None:
    model = Net()
    with torch.no_grad():
        model.fc1.bias.fill_(-100.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with trainsentry_probe.watch(model, opt, tmp_path, sample_every=1) as probe:
        for x, y in batches(2):
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            probe.record()
    _, records = read(tmp_path)
    assert records[1]["probe/dead_fraction/act"] == pytest.approx(1.0)
    assert records[1]["probe/zero_fraction/act"] == pytest.approx(1.0)
    assert records[1]["probe/act_mean/act"] == 0.0


def test_per_sample_loss_spread_matches_numpy(tmp_path: Path) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = torch.cat([torch.linspace(0.1, 1.0, 95), torch.full((5,), 20.0)])
    with trainsentry_probe.watch(model, opt, tmp_path, sample_every=1) as probe:
        x, y = batches(1)[0]
        F.cross_entropy(model(x), y).backward()
        opt.step()
        probe.record(loss=losses.mean(), per_sample_loss=losses[torch.randperm(100)])
    _, records = read(tmp_path)
    r = records[0]
    values = losses.numpy().astype(np.float64)
    p50, p95 = np.percentile(values, 50), np.percentile(values, 95)
    assert r["probe/sample_loss/p50"] == pytest.approx(p50, rel=1e-5)
    assert r["probe/sample_loss/p95"] == pytest.approx(p95, rel=1e-5)
    assert r["probe/sample_loss/p95_over_p50"] == pytest.approx(p95 / p50, rel=1e-5)
    assert r["probe/sample_loss/top5_share"] == pytest.approx(100 / values.sum(), rel=1e-5)
    assert r["probe/loss"] == pytest.approx(float(losses.mean()), rel=1e-6)


class Tiny(nn.Module):
    """Embedding → transformer encoder layer (dropout, MHA) → head: every hook kind."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 16)
        self.encoder = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True)
        self.head = nn.Linear(16, 20)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens)))


def train_tiny(logdir: Path | None, steps: int = 6) -> dict[str, torch.Tensor]:
    torch.manual_seed(4)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = None
    if logdir is not None:
        probe = trainsentry_probe.watch(model, opt, logdir, layer_every=1, sample_every=2)
    g = torch.Generator().manual_seed(5)
    for _ in range(steps):
        tokens = torch.randint(0, 20, (4, 7), generator=g)
        logits = model(tokens)
        per_sample = F.cross_entropy(logits.reshape(-1, 20), tokens.reshape(-1), reduction="none")
        per_sample.mean().backward()
        opt.step()
        opt.zero_grad()
        if probe is not None:
            probe.record(loss=per_sample.mean(), per_sample_loss=per_sample)
    if probe is not None:
        probe.close()
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_training_is_bit_identical_with_and_without_the_probe(tmp_path: Path) -> None:
    plain = train_tiny(None)
    probed = train_tiny(tmp_path)
    assert plain.keys() == probed.keys()
    assert all(torch.equal(plain[k], probed[k]) for k in plain)
    _, records = read(tmp_path)
    sampled = records[2]
    entropy = sampled["probe/attn_entropy/encoder.self_attn"]
    assert 0 < entropy <= math.log(7) + 1e-6
    assert sampled["probe/embed_norm_spread/embed"] > 0
    assert "probe/sample_loss/p95" in sampled and "probe/sample_loss/p95" not in records[1]


def test_uniform_attention_has_the_entropy_of_a_uniform_distribution(tmp_path: Path) -> None:
    model = Tiny()
    with torch.no_grad():  # q = k = 0: every query attends uniformly to the 7 keys
        model.encoder.self_attn.in_proj_weight[:32].zero_()
        model.encoder.self_attn.in_proj_bias.zero_()  # type: ignore[union-attr]
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    with trainsentry_probe.watch(model, opt, tmp_path, sample_every=1):
        model(torch.randint(0, 20, (3, 7))).sum().backward()
        opt.step()
    _, records = read(tmp_path)
    assert records[0]["probe/attn_entropy/encoder.self_attn"] == pytest.approx(math.log(7))


def test_one_oversized_embedding_row_raises_the_norm_spread(tmp_path: Path) -> None:
    spreads = []
    for scale in (1.0, 100.0):
        model = Tiny()
        with torch.no_grad():
            model.embed.weight[3] *= scale
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        logdir = tmp_path / str(scale)
        with trainsentry_probe.watch(model, opt, logdir, sample_every=1):
            model(torch.randint(0, 20, (2, 5))).sum().backward()
            opt.step()
        spreads.append(read(logdir)[1][0]["probe/embed_norm_spread/embed"])
    assert spreads[1] > 10 * spreads[0]


def test_gradient_accumulation_counts_optimizer_steps_and_averages_the_loss(
    tmp_path: Path,
) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    given = []
    with trainsentry_probe.watch(model, opt, tmp_path) as probe:
        for i, (x, y) in enumerate(batches(6)):
            loss = F.cross_entropy(model(x), y)
            (loss / 3).backward()
            probe.record(loss=loss)  # before the step: belongs to the step in progress
            given.append(float(loss.detach()))
            if i % 3 == 2:
                opt.step()
                opt.zero_grad()
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [0, 1]
    assert records[0]["probe/loss"] == pytest.approx(sum(given[:3]) / 3, rel=1e-6)
    assert records[1]["probe/loss"] == pytest.approx(sum(given[3:]) / 3, rel=1e-6)


def test_validation_passes_do_not_count_as_training_steps(tmp_path: Path) -> None:
    class WithLoss(Net):
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # returns its loss, as HF models
            return super().forward(x).pow(2).mean()

    model = WithLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train, val = [], []
    with trainsentry_probe.watch(model, opt, tmp_path) as probe:
        for x, _ in batches(3):
            train_loss = model(x)
            train_loss.backward()
            opt.step()
            opt.zero_grad()
            train.append(float(train_loss.detach()))
            model.eval()
            with torch.no_grad():
                val.append(float(model(x + 1)))
            model.train()
            probe.record(val_loss=val[-1])
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [r["probe/loss"] for r in records] == pytest.approx(train, rel=1e-6)
    assert [r["probe/val_loss"] for r in records] == pytest.approx(val, rel=1e-6)


def test_without_an_optimizer_record_marks_each_step(tmp_path: Path) -> None:
    model = Net()
    with trainsentry_probe.watch(model, None, tmp_path, layer_every=2) as probe:
        for step, (x, y) in enumerate(batches(4), start=100):
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            probe.record(step, loss=loss)
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.1 * p.grad  # type: ignore[operator]
                    p.grad = None
    _, records = read(tmp_path)
    assert [r["step"] for r in records] == [100, 101, 102, 103]
    assert all(r["probe/grad_norm"] > 0 for r in records)
    assert "probe/grad_norm/fc1" in records[0] and "probe/grad_norm/fc1" not in records[1]


def test_an_internal_failure_disables_the_probe_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(gradients, "gradient_step", broken)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(model, opt, tmp_path)
    for x, y in batches(3):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        probe.record(loss=1.0)
    probe.close()
    assert isinstance(probe.failed, RuntimeError) and "disabled" in caplog.text
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks


def test_should_stop_honours_a_stop_file_and_can_raise(tmp_path: Path) -> None:
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    probe = trainsentry_probe.watch(model, opt, tmp_path, stop_every=3)
    assert not probe.should_stop()  # call 1 looks: nothing there
    stop = tmp_path / ".trainsentry" / "STOP"
    stop.parent.mkdir()
    stop.write_text(
        json.dumps({"rule": "layer_grad_norm_non_finite", "step": 41, "reason": "fc2 is NaN"})
    )
    assert [probe.should_stop() for _ in range(3)] == [False, False, True]  # one stat per 3
    with pytest.raises(TrainingStopped, match=r"layer_grad_norm_non_finite.*step 41.*fc2 is NaN"):
        probe.should_stop(raise_error=True)
    assert probe.stop_request is not None and probe.stop_request.step == 41
    probe.close()


def test_a_stop_file_older_than_the_run_is_ignored(tmp_path: Path) -> None:
    stop = tmp_path / "control" / "STOP"
    stop.parent.mkdir()
    stop.write_text("stop")
    old = time.time() - 3600
    os.utime(stop, (old, old))
    probe = trainsentry_probe.watch(
        Net(), None, tmp_path, control_dir=str(stop.parent), stop_every=1
    )
    assert not probe.should_stop()
    stop.write_text("not valid json, still a stop")  # rewritten now: a fresh request
    with pytest.raises(TrainingStopped, match="not valid json"):
        probe.should_stop(raise_error=True)
    probe.close()


def test_the_daemons_stop_file_is_understood(tmp_path: Path) -> None:
    stop_file = pytest.importorskip("trainsentry.actions.stop_file")
    path = stop_file.stop_file_path("runs/a", tmp_path, None)
    probe = trainsentry_probe.watch(Net(), None, tmp_path, stop_every=1)
    stop_file.write_stop_file(path, {"rule": "r", "step": 9, "message": "why", "run": "runs/a"})
    assert probe.should_stop()
    assert probe.stop_request is not None
    assert (probe.stop_request.rule, probe.stop_request.step, probe.stop_request.reason) == (
        "r",
        9,
        "why",
    )
    probe.close()


def test_a_misspelt_option_is_rejected_with_a_suggestion(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="did you mean 'layer_every'"):
        trainsentry_probe.watch(Net(), None, tmp_path, layers_every=10)


def test_the_nvml_sampler_reports_utilisation_and_memory() -> None:
    class FakeNvml:
        def nvmlDeviceGetUtilizationRates(self, handle: object) -> Any:
            return type("U", (), {"gpu": 42})()

        def nvmlDeviceGetMemoryInfo(self, handle: object) -> Any:
            return type("M", (), {"used": 123})()

    sampler = NvmlSampler(FakeNvml(), object(), 0.01, lambda v: None)
    assert sampler.sample() == {"gpu_util": 42.0, "gpu_mem_used": 123.0}
    assert NvmlSampler.start_for(torch.device("cpu"), 5.0, lambda v: None) is None


def test_the_probe_imports_neither_the_daemon_nor_the_trainer_libraries() -> None:
    code = (
        "import sys, trainsentry_probe, trainsentry_probe.probe;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('trainsentry', 'lightning', 'pytorch_lightning', 'transformers')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
