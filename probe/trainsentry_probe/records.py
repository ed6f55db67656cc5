"""The probe's record format (versioned): from a row's values to one JSON object.

This is the only contract between the probe and the daemon (FORMAT.md has the
full description). Values are flat keys under `probe/`, which the daemon's
JSONL source reads as series of the same names and its alias table maps onto
canonical names (`probe/grad_norm/fc1` → `grad_norm/fc1`). Each rank of a
distributed job writes a file of its own (`file_name`), which the daemon
makes a run of its own, so the keys are the same on every rank.

Ratios (update ratio, concentration, loss spread) are formed here on the host
after the transfer: a zero denominator then means "no value" rather than an
infinity that non-finite rules would page on.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainsentry_probe.clock import elapsed
from trainsentry_probe.layers import LayerMap
from trainsentry_probe.losses import spread_fields
from trainsentry_probe.sharded import on_host
from trainsentry_probe.transfer import Row

RECORD_FORMAT = "trainsentry-probe"
RECORD_FORMAT_VERSION = 2
PREFIX = "probe"

# host values copied as they are: name in the row → key under the prefix
_HOST_KEYS = (
    "loss",
    "lr",
    "step_time",
    "data_wait",
    "forward_time",
    "samples_per_second",
    "gpu_mem",
    "gpu_mem_reserved",
    "gpu_mem_peak",
)


# what a rank that records timing and loss only writes (ranks > 0 without all_ranks)
TIMING_KEYS = ("step_time", "data_wait", "forward_time", "loss")


def file_name(rank: int, world_size: int) -> str:
    """The probe's file in its log directory: the run's own in a single process, one
    per rank (named by its global rank) in a distributed job."""
    if world_size > 1:
        return f"trainsentry-probe.rank{rank}.jsonl"
    return "trainsentry-probe.jsonl"


def concentration(layer_norms: list[float]) -> float | None:
    """max / median of the finite layer norms: one layer carrying the gradient."""
    finite = [n for n in layer_norms if math.isfinite(n)]
    if len(finite) < 2:
        return None
    middle = statistics.median(finite)
    return max(finite) / middle if middle > 0 else None


class RecordRenderer:
    """Turns rows into records; runs on the writer thread."""

    def __init__(self, layers: LayerMap, *, timing_only: bool = False) -> None:
        self.layers = layers
        self.prefix = PREFIX
        self.timing_only = timing_only  # TIMING_KEYS alone, whatever the row holds
        self.skipped_steps = 0  # counted here: a fused optimizer's flag arrives as a value

    def render(self, row: Row, values: dict[str, list[float]]) -> dict[str, Any]:
        p = self.prefix
        host = row.host
        events = host.get("forward_events")
        if events is not None:  # CUDA: read now, after the batch's event (clock.py)
            seconds = elapsed(events)
            host = {**host, "forward_time": seconds} if seconds is not None else host
        if self.timing_only:
            return self._timing(row, host, values)
        if self.layers.sharded:
            values = on_host(row, values)
        record: dict[str, Any] = {"step": row.step, "time": row.time}
        for key in _HOST_KEYS:
            if key in host:
                record[f"{p}/{key}"] = host[key]
        if "loss" in values:
            record[f"{p}/loss"] = values["loss"][0]
        if "lr" in values:
            record[f"{p}/lr"] = values["lr"][0]
        skipped = bool(row.host.get("skipped")) or values.get("found_inf", [0.0])[0] > 0
        if row.host.get("amp"):
            self.skipped_steps += skipped
            record[f"{p}/amp_skipped"] = int(skipped)
            record[f"{p}/amp_skipped_steps"] = self.skipped_steps
        if "grad_scale" in values:
            record[f"{p}/grad_scale"] = values["grad_scale"][0]
        if "grad_params" in values:
            indices, per_param = row.host["grad_indices"], values["grad_params"]
            bad = sum(1 for n in per_param if not math.isfinite(n))
            record[f"{p}/nonfinite_grads"] = bad
        if skipped:  # an overflow the scaler caught and never applied (amp.py): no norms
            values = {k: v for k, v in values.items() if k not in ("grad_params", "update")}
        if "grad_params" in values:
            record[f"{p}/grad_norm"] = math.sqrt(sum(n * n for n in per_param))
            if bad:
                record[f"{p}/first_nonfinite"] = self.layers.first_nonfinite(indices, per_param)
        if "grad_params" in values and row.host.get("layer_step"):
            norms = self.layers.group(row.host["grad_indices"], values["grad_params"])
            for layer, norm in sorted(norms.items()):
                record[f"{p}/grad_norm/{self.layers.names[layer]}"] = norm
            ratio = concentration(list(norms.values()))
            if ratio is not None:
                record[f"{p}/grad_concentration"] = ratio
        if "param_norms" in values:
            norms = self.layers.group(range(len(self.layers.params)), values["param_norms"])
            for layer, norm in sorted(norms.items()):
                record[f"{p}/param_norm/{self.layers.names[layer]}"] = norm
        if "update" in values:
            self._update_ratios(record, row.host["update_indices"], values["update"])
        if "sample_loss" in values:
            for key, value in spread_fields(values["sample_loss"]).items():
                record[f"{p}/sample_loss/{key}"] = value
        for name, value in row.host.get("extra", {}).items():
            record[f"{p}/{name}"] = value
        for name, got in values.items():
            if name.startswith(("act:", "x:")):
                record[f"{p}/{name.split(':', 1)[1]}"] = got[0]
        return record

    def _timing(
        self, row: Row, host: dict[str, Any], values: dict[str, list[float]]
    ) -> dict[str, Any]:
        p = self.prefix
        record: dict[str, Any] = {"step": row.step, "time": row.time}
        for key in TIMING_KEYS:
            if key in host:
                record[f"{p}/{key}"] = host[key]
        if "loss" in values:
            record[f"{p}/loss"] = values["loss"][0]
        return record

    def _update_ratios(self, record: dict[str, Any], indices: list[int], both: list[float]) -> None:
        half = len(both) // 2
        before = self.layers.group(indices, both[:half])
        delta = self.layers.group(indices, both[half:])
        p = self.prefix
        for layer in sorted(before):
            if before[layer] > 0:
                record[f"{p}/update_ratio/{self.layers.names[layer]}"] = (
                    delta[layer] / before[layer]
                )
        total_before = math.sqrt(sum(v * v for v in before.values()))
        if total_before > 0:
            total_delta = math.sqrt(sum(v * v for v in delta.values()))
            record[f"{p}/update_ratio"] = total_delta / total_before
