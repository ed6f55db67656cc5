"""The probe under mixed precision on the CPU: bf16 autocast and a real
torch.amp.GradScaler, with an inf injected so the scaler really skips steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import Net, layer_norm, read
from torch import nn

import trainsentry_probe


def records(logdir: Path) -> list[dict[str, Any]]:
    return read(logdir)[1]


def train(
    logdir: Path | None,
    steps: int = 6,
    overflow_at: tuple[int, ...] = (),
    fused: bool = False,
    accumulate: int = 1,
) -> dict[str, Any]:
    """An AMP loop as the torch docs write it, with unscale_ before clipping; at the
    steps in `overflow_at` fc1's gradient becomes inf, so the scaler skips them.
    Returns the final weights, the scaler's scale, and per step what the loop saw:
    the unscaled total norm clip_grad_norm_ returned and fc2's unscaled norm."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    probe = None
    if logdir is not None:
        probe = trainsentry_probe.watch(model, opt, logdir, layer_every=1, grad_scaler=scaler)
    g = torch.Generator().manual_seed(1)
    seen: list[tuple[float, float]] = []
    for step in range(steps):
        handle = None
        if step in overflow_at:
            handle = model.fc1.weight.register_hook(lambda grad: grad * float("inf"))
        for _ in range(accumulate):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss / accumulate).backward()
            if probe is not None:
                probe.record(loss=loss)
        if not fused:  # a fused optimizer unscales inside its step
            scaler.unscale_(opt)
            total = float(nn.utils.clip_grad_norm_(model.parameters(), 1e9))
            seen.append((total, layer_norm([p.grad for p in model.fc2.parameters()])))  # type: ignore[misc]
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if handle is not None:
            handle.remove()
    if probe is not None:
        probe.close()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    return {"weights": weights, "scale": scaler.get_scale(), "seen": seen}


def test_norms_under_a_grad_scaler_are_those_of_the_unscaled_gradients(tmp_path: Path) -> None:
    seen = train(tmp_path)["seen"]
    got = records(tmp_path)
    assert [r["probe/grad_norm"] for r in got] == pytest.approx([s[0] for s in seen], rel=1e-5)
    assert [r["probe/grad_norm/fc2"] for r in got] == pytest.approx([s[1] for s in seen], rel=1e-5)
    assert all(r["probe/grad_scale"] == 2.0**12 for r in got)
    assert all(r["probe/amp_skipped"] == 0 and r["probe/amp_skipped_steps"] == 0 for r in got)


def test_a_step_the_scaler_skips_is_counted_and_its_overflow_is_not_reported(
    tmp_path: Path,
) -> None:
    run = train(tmp_path, overflow_at=(2, 4))
    got = records(tmp_path)
    assert [r["step"] for r in got] == [0, 1, 2, 3, 4, 5]  # skipped steps keep their number
    assert [r["probe/amp_skipped"] for r in got] == [0, 0, 1, 0, 1, 0]
    assert [r["probe/amp_skipped_steps"] for r in got] == [0, 0, 1, 1, 2, 2]
    assert [r["probe/grad_scale"] for r in got] == [4096, 4096, 4096, 2048, 2048, 1024]
    assert run["scale"] == 2.0**10  # the scaler halved its scale twice: it did skip
    for r in (got[2], got[4]):  # the overflow is counted, but no norm pages on it
        assert r["probe/nonfinite_grads"] == 1  # fc1.weight
        assert not {"probe/grad_norm", "probe/grad_norm/fc1", "probe/update_ratio"} & r.keys()
        assert "probe/loss" in r and "probe/step_time" in r
    applied = [s[0] for i, s in enumerate(run["seen"]) if i not in (2, 4)]
    norms = [r["probe/grad_norm"] for i, r in enumerate(got) if i not in (2, 4)]
    assert norms == pytest.approx(applied, rel=1e-5)
    assert all(r["probe/update_ratio/fc1"] > 0 for i, r in enumerate(got) if i not in (2, 4))


def test_a_fused_optimizer_that_skips_inside_its_step_is_counted_too(tmp_path: Path) -> None:
    train(tmp_path, overflow_at=(1,), fused=True, steps=4)
    got = records(tmp_path)
    assert [r["probe/amp_skipped"] for r in got] == [0, 1, 0, 0]
    assert [r["probe/amp_skipped_steps"] for r in got] == [0, 1, 1, 1]
    assert "probe/grad_norm" not in got[1] and "probe/update_ratio" not in got[1]
    unfused = train(None, steps=1)  # step 0's gradients are the same with either optimizer
    assert got[0]["probe/grad_norm"] == pytest.approx(unfused["seen"][0][0], rel=1e-5)


def test_micro_batches_of_an_accumulating_step_are_not_taken_for_skipped_steps(
    tmp_path: Path,
) -> None:
    train(tmp_path, steps=3, accumulate=3, overflow_at=(1,))
    got = records(tmp_path)
    assert [r["step"] for r in got] == [0, 1, 2]
    assert [r["probe/amp_skipped"] for r in got] == [0, 1, 0]


def test_training_under_amp_is_bit_identical_with_and_without_the_probe(tmp_path: Path) -> None:
    for fused in (False, True):
        plain = train(None, overflow_at=(3,), fused=fused)
        probed = train(tmp_path / str(fused), overflow_at=(3,), fused=fused)
        assert plain["scale"] == probed["scale"]
        assert all(torch.equal(plain["weights"][k], probed["weights"][k]) for k in plain["weights"])
