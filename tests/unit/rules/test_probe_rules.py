"""The default pack's probe rules on synthetic probe series: silent on a healthy
run, each firing on its own fault after the onset (the same shape as
test_rules_default_pack.py's FAULTS, for the probe's metrics). The faults are in
support/probe_faults.py because the default pack's tests read the probe rules from there."""

from __future__ import annotations

import math
import random

import pytest
from support.probe_faults import FAULTS, ONSET, PROBE_RULES, Series

from trainsentry.backtest.replay import replay_transitions
from trainsentry.point import Point
from trainsentry.rules.loader import load_rules

PACK = load_rules()
WALL0 = 1_790_000_000.0
LAYERS = {"embed": 0.5, "blocks.0.attn": 0.2, "blocks.0.mlp": 0.3, "head": 1.0}


def healthy(seed: int = 0, steps: int = 40_000) -> Series:
    """A probe file's series at the default cadences: 0.5 s per step (its step time
    every 10th, to keep the run small), layer
    statistics every 100 steps, activations every 1000, NVML every 5 s."""
    rng = random.Random(seed)
    out: Series = {}

    def add(tag: str, step: int, value: float) -> None:
        out.setdefault(tag, []).append([step, WALL0 + 0.5 * step, value])

    for s in range(0, steps + 1, 10):
        add("probe/gpu_util", s, min(100.0, 92 + rng.gauss(0, 4)))
        add("probe/step_time", s, 0.5)
        if s % 100:
            continue
        decay = 1 + 0.5 * math.exp(-s / 5000)
        norms = []
        for layer, base in LAYERS.items():
            norm = base * decay * math.exp(rng.gauss(0, 0.3))
            norms.append(norm)
            add(f"probe/grad_norm/{layer}", s, norm)
            add(f"probe/update_ratio/{layer}", s, 1e-3 * math.exp(rng.gauss(0, 0.3)))
        add("probe/grad_concentration", s, max(norms) / sorted(norms)[len(norms) // 2])
        add("probe/gpu_mem", s, 12e9 + (3e9 if s > 0 else 0) + rng.gauss(0, 5e7))
        if s % 1000 == 0:
            add("probe/dead_fraction/blocks.0.mlp.act", s, max(0.0, 0.05 + rng.gauss(0, 0.02)))
    return out


def as_points(series: Series, run: str = "exp/seed0") -> list[Point]:
    points = [Point(run, tag, int(s), w, v) for tag, rows in series.items() for s, w, v in rows]
    return sorted(points, key=lambda p: (p.wall_time, p.step))


def test_every_probe_rule_is_in_the_default_pack_and_has_a_fault_here() -> None:
    assert set(PROBE_RULES) <= {r.name for r in PACK.rules}
    assert set(FAULTS) == set(PROBE_RULES)


def test_a_healthy_probe_run_fires_nothing() -> None:
    fired = [t for t in replay_transitions(as_points(healthy()), PACK) if t.state == "firing"]
    assert not fired, [(t.rule, t.metric, t.step, t.message) for t in fired]


@pytest.mark.parametrize("rule", PROBE_RULES)
def test_each_probe_rule_fires_on_its_fault_after_the_onset(rule: str) -> None:
    run = healthy(seed=3)
    FAULTS[rule](run)
    fired = [t for t in replay_transitions(as_points(run), PACK) if t.state == "firing"]
    mine = [t for t in fired if t.rule == rule]
    assert mine, f"{rule} did not fire; fired: {[(t.rule, t.step) for t in fired]}"
    # a leak of 1 % per 100 steps needs ~4100 steps to reach ×1.5, then 10 points
    within = 6000 if rule == "gpu_memory_leak" else 3000
    assert ONSET <= mine[0].step <= ONSET + within, mine[0].message
    assert mine[0].message and mine[0].runbook
