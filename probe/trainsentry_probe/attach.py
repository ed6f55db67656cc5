"""How the probe attaches to what the user hands it: optimizer wrappers, forward
outputs and inputs, and the guard that keeps a probe failure out of the loop.

Trainers wrap the torch optimizer (Lightning's LightningOptimizer, accelerate's
AcceleratedOptimizer); step hooks must sit on the torch optimizer inside, the
one whose step() actually runs. Forward outputs come as tensors, tuples, dicts
or HF ModelOutputs; the probe needs the tensor backward flows through (to
learn when backward ends) and the batch size (for throughput).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import torch
from torch import nn

log = logging.getLogger("trainsentry_probe")


class Guarded(Protocol):
    failed: BaseException | None
    closed: bool

    def _fail(self, exc: BaseException) -> None: ...


F = TypeVar("F", bound=Callable[..., Any])


def guarded(method: F) -> F:
    """Runs a hook body only while the probe works; a failure disables the probe."""

    @functools.wraps(method)
    def wrapper(self: Guarded, *args: Any, **kwargs: Any) -> Any:
        if self.failed is not None or self.closed:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            self._fail(exc)
            return None

    return wrapper  # type: ignore[return-value]


def eager(hook: F) -> F:
    """A module hook that torch.compile runs as Python, outside the graph.

    Dynamo otherwise traces module hooks into the compiled graph: the probe's
    clocks and flags would be read once at compile time, and a hook added
    later (the activation sampler arms on sampled steps only) would never run,
    since dynamo does not guard on module hooks. A disabled hook is a graph
    break where it is called (at the model's edges for the step hooks; inside
    the model only while sampling) and costs ~0.5 µs per call when eager.
    """
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    return disable(hook) if disable is not None else hook


def unwrap_model(model: nn.Module) -> nn.Module:
    """The user's module inside torch.compile's OptimizedModule (`_orig_mod`) and
    DDP/DataParallel (`module`): layers are named as the user named them, not
    `_orig_mod.module.fc1`."""
    seen = 0
    while seen < 5:
        inner = getattr(model, "_orig_mod", None)
        if inner is None and isinstance(
            model, (nn.parallel.DistributedDataParallel, nn.DataParallel)
        ):
            inner = model.module
        if not isinstance(inner, nn.Module):
            return model
        model, seen = inner, seen + 1
    return model


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside a wrapper (Lightning's LightningOptimizer keeps it
    as `_optimizer`, accelerate's AcceleratedOptimizer as `optimizer`)."""
    seen = 0
    while optimizer is not None and seen < 5:
        if type(optimizer).__module__.startswith("torch.optim") or (
            isinstance(optimizer, torch.optim.Optimizer) and not hasattr(optimizer, "optimizer")
        ):
            return optimizer
        inner = getattr(optimizer, "_optimizer", None) or getattr(optimizer, "optimizer", None)
        if inner is None:
            break
        optimizer, seen = inner, seen + 1
    return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None


def first_grad_tensor(output: Any) -> torch.Tensor | None:
    """The first tensor in a forward's output that backward will flow through."""
    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    if isinstance(output, dict):
        values: Any = output.values()
    elif isinstance(output, (tuple, list)):
        values = output
    else:
        values = getattr(output, "__dict__", {}).values()
    for value in values:
        if isinstance(value, torch.Tensor) and value.requires_grad:
            return value
    return None


def batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Samples in a forward call: the leading dimension of its first tensor argument."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            return int(value.shape[0])
    return 0
