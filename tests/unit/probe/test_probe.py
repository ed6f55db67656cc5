"""The probe on real (tiny) torch training loops on the CPU: every statistic
against a straightforward reference computation, and bit-identical training."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import Net, batches, layer_norm, read
from torch import nn

import trainsentry_probe


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


def test_sparse_embedding_gradients_are_normed_with_the_dense_ones(tmp_path: Path) -> None:
    # nn.Embedding(sparse=True) gives a sparse gradient, which the fused norm kernel
    # refuses: the probe notices once and takes each such gradient's values instead.
    torch.manual_seed(2)
    embed, head = nn.Embedding(50, 8, sparse=True), nn.Linear(8, 3)
    model = nn.Sequential(embed, nn.Flatten(), nn.Linear(8 * 4, 8), nn.ReLU(), head)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    total, embedding = [], []
    with trainsentry_probe.watch(model, opt, tmp_path, layer_every=2):
        for _ in range(5):
            x = torch.randint(0, 50, (16, 4))
            F.cross_entropy(model(x), x[:, 0] % 3).backward()
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            assert grads[0].is_sparse
            dense = [g.coalesce().values() if g.is_sparse else g for g in grads]
            total.append(layer_norm(dense))
            embedding.append(layer_norm(dense[:1]))
            opt.step()
            opt.zero_grad()
    _, records = read(tmp_path)
    assert [r["probe/grad_norm"] for r in records] == pytest.approx(total, rel=1e-5)
    for step in (0, 2, 4):
        assert records[step]["probe/grad_norm/0"] == pytest.approx(embedding[step], rel=1e-5)


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
