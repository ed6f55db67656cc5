"""Gradient and weight statistics of one optimizer step, computed on the device.

Everything here launches kernels and returns device tensors; nothing reads a
value back, so a step that records nothing never waits for the device. The
norms use the fused `torch._foreach_norm` (one kernel per device and dtype
for the whole parameter list, where a loop of `.norm()` calls launches one per
parameter and, with `.item()`, synchronises on each). Norms accumulate in
float32 whatever the gradient dtype, so bf16 gradients do not lose the norm
to rounding.

Nothing here modifies a gradient or a weight: the snapshot for update ratios
is a copy, and the only in-place operation is on that copy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainsentry_probe.layers import LayerMap, weights, with_grads


def norms_of(
    tensors: list[torch.Tensor], device: torch.device, *, sparse: bool = False
) -> torch.Tensor:
    """The 2-norm of each tensor as one float32 vector on `device`.

    Read under no_grad, so callers hand gradients and parameters as they are
    (no `detach()` per tensor: a new tensor object each, on every step).
    `sparse`: some may be sparse (an `nn.Embedding(sparse=True)`'s gradient),
    which the fused kernel refuses; they take a tensor-by-tensor path.
    """
    if not tensors:
        return torch.zeros(0, dtype=torch.float32, device=device)
    with torch.no_grad():
        if sparse:
            dense = [t.coalesce()._values() if t.is_sparse else t for t in tensors]
            return torch.stack([torch.linalg.vector_norm(t.float()).to(device) for t in dense])
        try:
            norms = list(torch._foreach_norm(tensors, 2, dtype=torch.float32))
        except (TypeError, RuntimeError):  # torch without the dtype argument
            norms = [n.float() for n in torch._foreach_norm(tensors, 2)]
        try:
            stacked = torch.stack(norms)
        except RuntimeError:  # a model spread over devices
            return torch.stack([n.to(device) for n in norms])
    return stacked if stacked.device == device else stacked.to(device)


@dataclass
class GradientStep:
    """One step's gradient norms, still on the device."""

    indices: list[int]  # parameters that had a gradient, by LayerMap index
    per_param: torch.Tensor  # their norms (float32)


def gradient_step(layers: LayerMap, device: torch.device) -> GradientStep | None:
    """The norm of every gradient: one fused kernel and one stack.

    Everything else (the total, the non-finite count, the layer a non-finite
    gradient appeared in, per-layer norms) is arithmetic on these few hundred
    numbers, done on the writer thread after the transfer: each small device op
    costs more to launch (~10 µs) than the host needs for the whole sum, and
    shipping P floats instead of 3 is nothing next to a step.
    """
    indices, grads = with_grads(layers)
    if not grads:
        return None
    if not layers.sparse_grads:
        # No look at every gradient's layout each step (an attribute read per tensor,
        # every step): the fused kernel refuses a sparse one, and from then on the
        # model is known to have some.
        try:
            return GradientStep(indices, norms_of(grads, device))
        except RuntimeError:  # NotImplementedError for a sparse layout is one
            if not any(g.is_sparse for g in grads):
                raise
            layers.sparse_grads = True
    return GradientStep(indices, norms_of(grads, device, sparse=True))


@dataclass
class Snapshot:
    """Trainable weights (or a fixed sample of them) before a step, for ||Δw|| / ||w||."""

    indices: list[int]
    before: list[torch.Tensor]
    strides: list[int]


def sample_stride(param: torch.Tensor, limit: int) -> int:
    """Every k-th element, so at most `limit` are kept (1 = all); k coprime with the
    last dimension, so the sample walks through every column instead of one."""
    n = param.numel()
    if limit <= 0 or n <= limit:
        return 1
    k = -(-n // limit)
    last = param.shape[-1] if param.ndim else 1
    while math.gcd(k, last) != 1:
        k += 1
    return k


def _view(param: torch.Tensor, stride: int) -> torch.Tensor:
    flat = param.detach().reshape(-1)
    return flat if stride == 1 else flat[::stride]


def snapshot(layers: LayerMap, sample: int) -> Snapshot | None:
    """Copies the trainable weights before a layer-statistics step.

    A full copy costs a model's worth of memory and bandwidth; the ratio of two
    norms over a fixed sample of a large tensor's elements estimates the full
    ratio to about a percent at 65k elements, which does not matter against
    thresholds orders of magnitude apart. So tensors over `sample` elements
    (0: none) are sampled, smaller ones copied whole.
    """
    params = weights(layers)
    indices = [i for i, p in enumerate(layers.params) if p.requires_grad]
    if not indices:
        return None
    strides = [sample_stride(params[i], sample) for i in indices]
    views = [_view(params[i], k) for i, k in zip(indices, strides, strict=True)]
    return Snapshot(indices, list(torch._foreach_mul(views, 1.0)), strides)


def update_norms(layers: LayerMap, snap: Snapshot, device: torch.device) -> torch.Tensor:
    """[||w_before|| per parameter ..., ||Δw|| per parameter ...] on the device.

    Ratios are formed on the host after the transfer, where a zero weight norm
    (a bias initialised to zero) can be left out instead of dividing by zero.
    """
    before_norms = norms_of(snap.before, device)
    params = weights(layers)
    after = [_view(params[i], k) for i, k in zip(snap.indices, snap.strides, strict=True)]
    torch._foreach_sub_(snap.before, after)  # the copy becomes -Δw; the weights are untouched
    delta_norms = norms_of(snap.before, device)
    snap.before.clear()
    return torch.cat([before_norms, delta_norms])


def param_norms(layers: LayerMap, device: torch.device) -> torch.Tensor:
    """The norm of every parameter (frozen ones too: a frozen layer's size is still news)."""
    return norms_of(weights(layers), device)
