"""The probe's file as the daemon sees it: read by the JSONL source, named by the
alias table, judged by the default pack (a probe-only run, nothing else logged)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainsentry_probe
from trainsentry.rules.aliases import Aliases
from trainsentry.sources.reading import iter_points

RULES = "default"


def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)
    )


def run(
    logdir: Path,
    steps: int,
    explode_from: int | None = None,
    freeze_at: int | None = None,
    **options: object,
) -> None:
    """Trains with the probe; from `explode_from` on, layer "2"'s gradient grows ×1.5
    per step (as when one layer's attention logits run away), the others stay normal;
    at `freeze_at` layer "2" is frozen (requires_grad off, as a freeze schedule does)."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    state = {"step": 0}

    def grow(grad: torch.Tensor) -> torch.Tensor:
        if explode_from is None or state["step"] < explode_from:
            return grad
        return grad * 1.5 ** (state["step"] - explode_from)

    for param in model[2].parameters():
        param.register_hook(grow)
    with trainsentry_probe.watch(model, opt, logdir, **options) as probe:
        for step in range(steps):
            state["step"] = step
            if step == freeze_at:
                model[2].requires_grad_(False)
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 4, (16,), generator=g)
            per_sample = F.cross_entropy(model(x), y, reduction="none")
            loss = per_sample.mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the weights stay sane
            opt.step()
            opt.zero_grad()
            probe.record(loss=loss, per_sample_loss=per_sample)


def test_the_daemon_reads_every_probe_value_and_skips_the_meta_record(tmp_path: Path) -> None:
    logdir = tmp_path / "exp" / "seed0"
    run(logdir, 4, layer_every=2, sample_every=2)
    points = list(iter_points([logdir]))
    lines = (logdir / "trainsentry-probe.jsonl").read_text().splitlines()
    written = {
        (r["step"], k): v
        for r in map(json.loads, lines[1:])
        for k, v in r.items()
        if k.startswith("probe/") and isinstance(v, (int, float))
    }
    assert {(p.step, p.tag): p.value for p in points} == pytest.approx(written)
    assert {p.run for p in points} == {"seed0"}
    aliases = Aliases()
    canonical = {aliases.resolve(p.tag) for p in points}
    assert {
        "loss",
        "grad_norm",
        "lr",
        "step_time",
        "throughput",
        "data_wait",
        "grad_norm/2",
        "update_ratio/4",
        "dead_fraction/1",
        "grad_concentration",
        "sample_loss/p95",
    } - canonical == set()


def replayed(logdir: Path) -> list[dict[str, object]]:
    done = subprocess.run(
        [sys.executable, "-m", "trainsentry", "replay", str(logdir), "--rules", RULES,
         "--format", "jsonl"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_layer_frozen_mid_run_is_noticed_when_its_gradients_stop(tmp_path: Path) -> None:
    """The probe writes a layer's norm only while it has a gradient: frozen at step 1000,
    layer "2" falls silent while the others go on, and the pack says so 3 of its intervals on."""
    logdir = tmp_path / "frozen"
    run(logdir, 2400, freeze_at=1000)  # the probe's default cadence: layers every 100 steps
    firing = [a for a in replayed(logdir) if a["state"] == "firing"]
    stopped = [a for a in firing if a["rule"] == "layer_gradients_stopped"]
    assert [a["metric"] for a in stopped] == ["probe/grad_norm/2"], firing
    assert 1200 < int(str(stopped[0]["step"])) <= 1300  # its last point at 900, every 100
    assert "no point since step 900" in str(stopped[0]["message"])


def test_the_default_pack_fires_on_one_exploding_layer_of_a_probe_only_run(
    tmp_path: Path,
) -> None:
    logdir = tmp_path / "diverging"
    run(logdir, 320, explode_from=280, layer_every=4, sample_every=0)
    alerts = replayed(logdir)
    firing = [a for a in alerts if a["state"] == "firing"]
    layer = [a for a in firing if a["rule"] == "layer_grad_norm_far_above_baseline"]
    assert layer, [(a["rule"], a["metric"], a["step"]) for a in firing]
    assert {a["metric"] for a in layer} == {"probe/grad_norm/2"}
    assert all(280 < a["step"] <= 300 for a in layer)
    early = [a for a in firing if a["step"] < 280 and "grad" in a["metric"]]
    assert not early, "no gradient rule fires before the explosion"  # (pace rules may: timing)
    assert not [a for a in firing if a["rule"] == "layer_grad_norm_non_finite"]
    assert math.isfinite(layer[0]["value"])
