"""The probe on torch.compile'd models, on the CPU.

The backend is aot_eager: dynamo's tracing, graph breaks, guards and AOT
autograd, which is everything that decides whether the probe's hooks run,
without inductor's C++ code generation (about 25 s cold on this machine, per
test process). The same loops were run with inductor by hand: the same
records, and bit-identical training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from support.probe_loops import Net, read
from torch import nn
from torch._dynamo.utils import counters

import trainsentry_probe

BACKEND = "aot_eager"


def train(logdir: Path | None, order: str, steps: int = 8, **options: Any) -> dict[str, Any]:
    """`order`: "compile_then_watch" (the probe sees the OptimizedModule) or
    "watch_then_compile" (the probe hooks the eager module, which is compiled after)."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = None
    if order == "compile_then_watch":
        compiled = torch.compile(model, backend=BACKEND)
        if logdir is not None:
            probe = trainsentry_probe.watch(compiled, opt, logdir, **options)
    else:
        if logdir is not None:
            probe = trainsentry_probe.watch(model, opt, logdir, **options)
        compiled = torch.compile(model, backend=BACKEND)
    g = torch.Generator().manual_seed(1)
    norms, frames = [], []
    for _ in range(steps):
        x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
        loss = F.cross_entropy(compiled(x), y)
        loss.backward()
        norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), 1e9)))
        opt.step()
        opt.zero_grad()
        if probe is not None:
            probe.record(loss=loss)
        frames.append(counters["frames"]["total"])
    if probe is not None:
        probe.close()
        assert probe.failed is None
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    return {"norms": norms, "frames": frames, "weights": weights}


@pytest.mark.parametrize("order", ["compile_then_watch", "watch_then_compile"])
def test_a_compiled_model_gets_every_tier_at_its_cadence(tmp_path: Path, order: str) -> None:
    run = train(tmp_path, order, layer_every=2, sample_every=3)
    meta, records = read(tmp_path)
    assert meta["layers"] == ["fc1", "fc2", "head"]  # not _orig_mod.fc1
    assert [r["step"] for r in records] == list(range(8))
    assert [r["probe/grad_norm"] for r in records] == pytest.approx(run["norms"], rel=1e-5)
    for r in records:
        assert ("probe/grad_norm/fc2" in r) == (r["step"] % 2 == 0)
        assert ("probe/update_ratio/head" in r) == (r["step"] % 2 == 0)
        # hooks armed after compilation still run: dynamo does not guard on module hooks,
        # the probe's hooks are compiler-disabled so they run as Python (attach.eager)
        assert ("probe/dead_fraction/act" in r) == (r["step"] % 3 == 0)
        assert ("probe/saturation/squash" in r) == (r["step"] % 3 == 0)
        assert "probe/loss" in r and "probe/step_time" in r


def test_sampling_a_compiled_model_does_not_recompile_at_every_sample(tmp_path: Path) -> None:
    run = train(tmp_path, "compile_then_watch", steps=16, sample_every=2)
    frames = run["frames"]
    assert frames[5] == frames[-1], frames  # samples at 6, 8, ... 14 reuse the graphs


def test_training_a_compiled_model_is_bit_identical_with_and_without_the_probe(
    tmp_path: Path,
) -> None:
    for order in ("compile_then_watch", "watch_then_compile"):
        plain = train(None, order)
        probed = train(tmp_path / order, order, layer_every=1, sample_every=2)
        assert all(torch.equal(plain["weights"][k], probed["weights"][k]) for k in plain["weights"])
