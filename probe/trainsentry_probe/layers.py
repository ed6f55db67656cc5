"""Which parameters form a layer, and the order layers run in.

Rules speak of layers, optimizers of parameters. A layer here is a module that
owns parameters directly (`fc1` owns `fc1.weight` and `fc1.bias`); its norm is
the Euclidean norm over all its parameters, so it combines exactly like the
total norm does: sqrt(sum of squared parameter norms). A parameter that sits
directly on the root module is its own layer, named by the parameter.

Grouping happens on the writer thread after the one transfer per recorded
step: a few hundred floats summed in Python cost microseconds and spare the
device a scatter kernel per statistic.

Forward order is learned from the first training forward pass (hooks removed
right after). The first layer to show a non-finite gradient is taken in
*backward* order (the reverse), because backward runs from the output: a NaN
born in layer k's backward spreads to every layer before k, so the layer
nearest the output is where it appeared.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainsentry_probe.attach import eager
from trainsentry_probe.sharded import local


class LayerMap:
    """Parameters of a model grouped into layers, with their forward order."""

    def __init__(self, model: nn.Module) -> None:
        self.names: list[str] = []  # layer names, registration order
        self.params: list[nn.Parameter] = []  # every parameter, once
        self.param_names: list[str] = []
        self.layer_of: list[int] = []  # parameter index → layer index
        index: dict[str, int] = {}
        seen: set[int] = set()
        for module_name, module in model.named_modules():
            for param_name, param in module.named_parameters(recurse=False):
                if id(param) in seen:  # tied weights count once, with their first owner
                    continue
                seen.add(id(param))
                layer = module_name or param_name
                if layer not in index:
                    index[layer] = len(self.names)
                    self.names.append(layer)
                self.params.append(param)
                full = f"{module_name}.{param_name}" if module_name else param_name
                self.param_names.append(full)
                self.layer_of.append(index[layer])
        self._module_layer: dict[int, int] = {}
        for module_name, module in model.named_modules():
            if module_name in index:
                self._module_layer[id(module)] = index[module_name]
        self.forward_rank: list[int] = list(range(len(self.names)))  # until learned
        self._order: list[int] = []
        self._handles: list[RemovableHandle] = []
        self.trainable = [p.requires_grad for p in self.params]
        self.sparse_grads = False  # set once a sparse gradient is met (gradients.py)
        self.sharded = False  # DTensor parameters: norms of the local shards (sharded.py)

    def learn_order(self, model: nn.Module) -> None:
        """Hooks every layer-owning module once; `order_learned()` removes them."""
        for module in model.modules():
            layer = self._module_layer.get(id(module))
            if layer is not None:
                self._handles.append(
                    module.register_forward_pre_hook(eager(self._seen_hook(layer)))
                )

    def _seen_hook(self, layer: int) -> Callable[[nn.Module, tuple[object, ...]], None]:
        def hook(module: nn.Module, args: tuple[object, ...]) -> None:
            if layer not in self._order:
                self._order.append(layer)

        return hook

    def order_learned(self) -> None:
        """Stops learning: layers never seen (root-owned parameters, unused ones) go last."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        order = self._order + [i for i in range(len(self.names)) if i not in self._order]
        rank = [0] * len(self.names)
        for position, layer in enumerate(order):
            rank[layer] = position
        self.forward_rank = rank

    def forward_order(self) -> list[str]:
        return sorted(self.names, key=lambda n: self.forward_rank[self.names.index(n)])

    def group(self, param_indices: Sequence[int], norms: Iterable[float]) -> dict[int, float]:
        """Layer index → Euclidean norm over its parameters' norms (non-finite stays so)."""
        squares: dict[int, float] = {}
        for i, norm in zip(param_indices, norms, strict=True):
            layer = self.layer_of[i]
            squares[layer] = squares.get(layer, 0.0) + norm * norm
        return {layer: math.sqrt(total) for layer, total in squares.items()}

    def first_nonfinite(self, param_indices: Sequence[int], norms: Sequence[float]) -> str | None:
        """The layer nearest the output (first in backward order) with a non-finite norm."""
        bad = [
            self.layer_of[i]
            for i, n in zip(param_indices, norms, strict=True)
            if not math.isfinite(n)
        ]
        if not bad:
            return None
        return self.names[max(bad, key=lambda layer: self.forward_rank[layer])]


def with_grads(layers: LayerMap) -> tuple[list[int], list[torch.Tensor]]:
    """Indices and gradients of the parameters that have one this step.

    A Python pass over the parameter list (a few hundred for GPT-2 sized models,
    microseconds); unused and frozen parameters have no gradient and drop out.
    """
    indices: list[int] = []
    grads: list[torch.Tensor] = []
    for i, param in enumerate(layers.params):
        grad = param.grad
        if grad is not None:
            indices.append(i)
            grads.append(grad)  # read under no_grad (gradients.norms_of): no detach
    if layers.sharded:
        grads = [local(g) for g in grads]
    return indices, grads


def weights(layers: LayerMap) -> list[torch.Tensor]:
    """The parameters as the norms read them: a sharded model's by their local shards."""
    if layers.sharded:
        return [local(p) for p in layers.params]
    return list(layers.params)
