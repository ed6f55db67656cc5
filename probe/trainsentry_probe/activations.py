"""Activation, attention and embedding statistics from one sampled forward pass.

Forward hooks cost Python time on every call, so none are installed between
samples: the sampler is armed right before a sampled step's first training
forward and disarmed right after it. Everything computed is a device tensor,
read back with the step's other statistics in the one transfer.

- ReLU-like modules: the fraction of zeros, and the fraction of *dead units*
  (units zero for every sample in the batch). A unit is a feature of the last
  dimension for (batch, features) and (batch, time, features) outputs and a
  channel (dimension 1) for convolutional outputs.
- Tanh / sigmoid-like modules: saturation, the fraction of outputs within 1 %
  of the asymptotes, where the gradient is practically zero.
- Every hooked module: mean and standard deviation.
- nn.MultiheadAttention: the mean entropy (nats) of the attention
  distributions. Transformer layers call it with need_weights=False, and
  forcing weights would switch the fused kernel for the slow path and change
  training's numerics, so the sampler recomputes the weights separately from
  the hooked inputs, without dropout and without gradient. Limitation: only
  nn.MultiheadAttention is understood; attention written with
  F.scaled_dot_product_attention inside custom modules is not visible.

Functional activations (`F.relu(x)` in a forward method) are not modules and
are not seen; the documented limitation of module hooks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainsentry_probe.attach import eager

log = logging.getLogger("trainsentry_probe")

RELU_LIKE = (nn.ReLU, nn.ReLU6)
SATURATING = (nn.Tanh, nn.Sigmoid, nn.Hardtanh, nn.Hardsigmoid, nn.Softsign)
OTHER_ACTIVATIONS = (nn.GELU, nn.SiLU, nn.Mish, nn.ELU, nn.LeakyReLU, nn.Softplus)
_ZERO_CENTRED = (nn.Tanh, nn.Hardtanh, nn.Softsign)


def _units(x: torch.Tensor) -> torch.Tensor:
    """The activation as (positions, units): see the module docstring for what a unit is."""
    if x.ndim <= 1:
        return x.reshape(1, -1)
    unit_dim = x.ndim - 1 if x.ndim <= 3 else 1
    return x.movedim(unit_dim, -1).reshape(-1, x.shape[unit_dim])


def relu_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fraction of zero outputs, fraction of units zero for the whole batch)."""
    zero = (x == 0).float().mean()
    alive = (_units(x) != 0).any(dim=0)
    dead = 1.0 - alive.float().mean()
    return zero, dead


def saturation(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """Fraction of outputs within 1 % of the asymptotes (±1, or 0 and 1)."""
    if isinstance(module, _ZERO_CENTRED):
        return (x.abs() > 0.99).float().mean()
    return ((x < 0.01) | (x > 0.99)).float().mean()


def attention_entropy(
    module: nn.MultiheadAttention, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> torch.Tensor:
    """Mean entropy of the attention rows, recomputed without dropout or gradient."""
    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask")
    given = dict(zip(names, args, strict=False)) | kwargs
    query, key, value = given["query"], given["key"], given["value"]
    if module.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    separate = not module._qkv_same_embed_dim
    _, weights = F.multi_head_attention_forward(
        query,
        key,
        value,
        module.embed_dim,
        module.num_heads,
        module.in_proj_weight,
        module.in_proj_bias,
        module.bias_k,
        module.bias_v,
        module.add_zero_attn,
        0.0,
        module.out_proj.weight,
        module.out_proj.bias,
        training=False,
        key_padding_mask=given.get("key_padding_mask"),
        need_weights=True,
        attn_mask=given.get("attn_mask"),
        average_attn_weights=False,
        use_separate_proj_weight=separate,
        q_proj_weight=module.q_proj_weight,
        k_proj_weight=module.k_proj_weight,
        v_proj_weight=module.v_proj_weight,
    )
    assert weights is not None
    p = weights.float()
    return -(p * torch.log(p.clamp_min(1e-30))).sum(dim=-1).mean()


def embedding_stats(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean row norm, spread = std/mean of row norms): a few tokens whose vectors
    grow far beyond the rest is the representation-level sign of instability."""
    norms = torch.linalg.vector_norm(weight.detach().float(), dim=1)
    mean = norms.mean()
    return mean, norms.std(correction=0) / mean.clamp_min(1e-12)


class ActivationSampler:
    """Forward hooks installed for one training forward pass at a time."""

    def __init__(self, model: nn.Module) -> None:
        self.targets: list[tuple[str, nn.Module]] = []
        self.embeddings: list[tuple[str, nn.Embedding]] = []
        kinds = RELU_LIKE + SATURATING + OTHER_ACTIVATIONS + (nn.MultiheadAttention,)
        for name, module in model.named_modules():
            if isinstance(module, kinds):
                self.targets.append((name or type(module).__name__, module))
            if isinstance(module, nn.Embedding):
                self.embeddings.append((name or "embedding", module))
        self._handles: list[RemovableHandle] = []
        self._stats: list[tuple[str, torch.Tensor]] = []
        self._broken: set[str] = set()

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        if self._handles:
            return
        self._stats = []
        for name, module in self.targets:
            if name in self._broken:
                continue
            hook = self._hook(name)
            self._handles.append(module.register_forward_hook(eager(hook), with_kwargs=True))

    def disarm(self) -> list[tuple[str, torch.Tensor]]:
        """Removes the hooks; the statistics collected since `arm`, as (tag, 0-d tensor)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        stats, self._stats = self._stats, []
        return stats

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(
            module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
        ) -> None:
            if not module.training:
                return
            try:
                with torch.no_grad():
                    self._measure(name, module, args, kwargs, output)
            except Exception as exc:  # a statistic must never break the forward pass
                self._broken.add(name)
                log.warning("trainsentry probe: no activation statistics for %s: %s", name, exc)

        return hook

    def _measure(
        self,
        name: str,
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        out = self._stats
        if isinstance(module, nn.MultiheadAttention):
            out.append((f"attn_entropy/{name}", attention_entropy(module, args, kwargs)))
            return
        if not isinstance(output, torch.Tensor) or not output.is_floating_point():
            return
        x = output.detach()
        xf = x.float()
        out.append((f"act_mean/{name}", xf.mean()))
        out.append((f"act_std/{name}", xf.std(correction=0)))
        if isinstance(module, RELU_LIKE):
            zero, dead = relu_stats(x)
            out.append((f"zero_fraction/{name}", zero))
            out.append((f"dead_fraction/{name}", dead))
        elif isinstance(module, SATURATING):
            out.append((f"saturation/{name}", saturation(xf, module)))

    def embedding_stats(self) -> list[tuple[str, torch.Tensor]]:
        stats: list[tuple[str, torch.Tensor]] = []
        for name, module in self.embeddings:
            mean, spread = embedding_stats(module.weight)
            stats.append((f"embed_norm_mean/{name}", mean))
            stats.append((f"embed_norm_spread/{name}", spread))
        return stats
