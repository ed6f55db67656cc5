"""One fault per probe rule of the default pack, applied to a probe run's series from ONSET on.

Shared by the probe rules' tests, which check each fault fires its rule, and
the default pack's, which check every rule of the pack is either a probe rule
with a fault here or has a fault of its own there: a new rule without a test
fails one of the two.
"""

from __future__ import annotations

import math
from collections.abc import Callable

ONSET = 20_000
Series = dict[str, list[list[float]]]  # tag -> [[step, wall, value], ...]
PROBE_RULES = (
    "layer_grad_norm_non_finite",
    "layer_grad_norm_far_above_baseline",
    "layer_gradients_stopped",
    "layer_gradients_vanishing",
    "grad_concentration_high",
    "dead_units",
    "update_ratio_exploding",
    "gpu_underutilised",
    "gpu_memory_leak",
    "probe_steps_stopped",
)


def after(rows: list[list[float]], fn: Callable[[float, float], float]) -> None:
    for row in rows:
        if row[0] >= ONSET:
            row[2] = fn(row[0] - ONSET, row[2])


def hung(run: Series, tag: str, steps: int) -> None:
    """No record of `tag` for `steps` steps after ONSET: a loop that stopped stepping."""
    run[tag] = [row for row in run[tag] if not ONSET < row[0] < ONSET + steps]


def frozen(run: Series, tag: str) -> None:
    """The layer gets no gradient from ONSET on: the probe writes nothing for it."""
    run[tag] = [row for row in run[tag] if row[0] < ONSET]


FAULTS: dict[str, Callable[[Series], None]] = {
    "layer_grad_norm_non_finite": lambda run: after(
        run["probe/grad_norm/blocks.0.attn"], lambda d, v: math.nan
    ),
    "layer_grad_norm_far_above_baseline": lambda run: after(
        run["probe/grad_norm/blocks.0.attn"], lambda d, v: v * 1.5 ** (d / 100)
    ),
    "layer_gradients_stopped": lambda run: frozen(run, "probe/grad_norm/blocks.0.attn"),
    "layer_gradients_vanishing": lambda run: after(
        run["probe/grad_norm/blocks.0.attn"], lambda d, v: v * 1e-9
    ),
    "grad_concentration_high": lambda run: after(
        run["probe/grad_concentration"], lambda d, v: 300.0
    ),
    "dead_units": lambda run: after(run["probe/dead_fraction/blocks.0.mlp.act"], lambda d, v: 0.7),
    "update_ratio_exploding": lambda run: after(
        run["probe/update_ratio/blocks.0.mlp"], lambda d, v: 0.3
    ),
    "gpu_underutilised": lambda run: after(run["probe/gpu_util"], lambda d, v: 40.0),
    "gpu_memory_leak": lambda run: after(run["probe/gpu_mem"], lambda d, v: v * 1.01 ** (d / 100)),
    # the loop hangs after step ONSET for 1000 s while its GPU samples go on
    "probe_steps_stopped": lambda run: hung(run, "probe/step_time", 2000),
}
