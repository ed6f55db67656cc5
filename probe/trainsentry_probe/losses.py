"""The loss of a step and how it is spread over the samples of a batch.

A mean loss hides where it comes from: a batch whose loss is carried by a
few samples (mislabelled, corrupt, or simply hard) looks like any other. The
spread is summarised as the median and 95th percentile of the per-sample
losses, their ratio, and the share of the total carried by the hardest 5 %.

Everything stays on the device: the sample count is known on the host from
the tensor's shape, so the percentile positions are host arithmetic and the
sorted tensor is indexed with plain integers (views, no synchronisation).
"""

from __future__ import annotations

import math
from typing import Any

import torch

TOP_SHARE = 0.05  # the hardest 5 %


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss in a model's output, when the model computes it (HF models and
    many Lightning modules do): a 0-d floating tensor, `.loss`, or `["loss"]`."""
    candidate = output
    if not isinstance(output, torch.Tensor):
        candidate = getattr(output, "loss", None)
        if candidate is None and isinstance(output, dict):
            candidate = output.get("loss")
    ok = isinstance(candidate, torch.Tensor) and candidate.ndim == 0
    return candidate.detach() if ok and candidate.is_floating_point() else None


def _at(sorted_values: torch.Tensor, q: float) -> torch.Tensor:
    """Linear-interpolated quantile (numpy's default) of an ascending 1-d tensor."""
    position = (sorted_values.numel() - 1) * q
    low = math.floor(position)
    high = min(low + 1, sorted_values.numel() - 1)
    frac = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac


def spread(per_sample_loss: torch.Tensor) -> torch.Tensor | None:
    """[p50, p95, loss of the hardest 5 %, total loss] on the device; None when empty."""
    x = per_sample_loss.detach().reshape(-1).float()
    n = x.numel()
    if n == 0:
        return None
    ordered = torch.sort(x).values
    hardest = max(1, math.ceil(TOP_SHARE * n))
    return torch.stack(
        [_at(ordered, 0.5), _at(ordered, 0.95), ordered[n - hardest :].sum(), ordered.sum()]
    )


def spread_fields(values: list[float]) -> dict[str, float]:
    """The record fields from `spread`'s four numbers (ratios formed here, on the host)."""
    p50, p95, top, total = values
    fields = {"p50": p50, "p95": p95}
    if p50 > 0:
        fields["p95_over_p50"] = p95 / p50
    if total > 0:
        fields["top5_share"] = top / total
    return fields


def as_value(value: Any) -> torch.Tensor | float | None:
    """A loss or scalar given by the user: a detached tensor (mean if not a scalar),
    or a float; None for what is not a number."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        return t.float().mean() if t.ndim else t.float()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None
