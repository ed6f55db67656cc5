"""Norms of a sharded model (FSDP2's `fully_shard`): every rank holds a shard of each
parameter and of its gradient, so a norm is the root of the ranks' squared local norms summed.

The local norms are taken where they always are (gradients when backward ends,
before any clipping; weights around the optimizer step), on each rank's own
shards. One all-reduce per recorded step then sums their squares, at the
optimizer's step post-hook, which every rank passes once per step in the same
order whatever the probe is doing.

A collective makes each rank wait for all the others, and the probe must
never hang a job: so the all-reduce is issued by `ShardSum`, which counts
optimizer steps itself and runs on every rank, including one whose probe has
failed and turned itself off. A failed rank takes part for the rest of the job
with zeros and a flag; the flag travels in the summed vector, so the rows it
touched are known on every rank when they reach the host and their sharded
statistics are left out there (`records.py`), with no extra synchronisation.
Rows and the count disagree only if the step is renumbered (`record(step=)`)
off its optimizer count: such a row's sharded statistics are left out too,
never written as a shard's.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from trainsentry_probe.options import ProbeOptions, due
from trainsentry_probe.transfer import Row

FLAG = "sharded_failed"  # a row's chunk: > 0 when some rank could not give its shards' norms
HAS = "grad_has"  # a row's chunk: how many ranks had a gradient for each parameter
SUMMED = ("grad_params", "param_norms", "update")
_CHUNKS = (*SUMMED, HAS, FLAG)  # every chunk of a row the sums write or leave out
log = logging.getLogger(__name__)
_said = False  # the warning of on_host, once a process


def _dtensor() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch without DTensor (or without torch.distributed)
        return None
    return DTensor


def is_sharded(model: nn.Module) -> bool:
    """Parameters that are DTensors: FSDP2 (`fully_shard`), or tensor parallelism."""
    kind = _dtensor()
    return kind is not None and any(isinstance(p, kind) for p in model.parameters())


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (the tensor itself otherwise).

    `_local_tensor`, not `to_local()`: the public call is an autograd function
    that makes a new tensor object per call, a few µs per parameter per step;
    the attribute is the shard itself, read under no_grad only.
    """
    shard = getattr(tensor, "_local_tensor", None)
    return shard if isinstance(shard, torch.Tensor) else tensor


class ShardSum:
    """The one all-reduce per recorded step that makes the local norms the model's."""

    def __init__(self, n_params: int, n_trainable: int, options: ProbeOptions) -> None:
        self.n = n_params
        self.trainable = n_trainable
        self.options = options
        self.step = options.start_step  # optimizer steps, counted here alone
        dist = torch.distributed
        nccl = "nccl" in str(dist.get_backend()).lower()
        # the vector lives where the process group's backend takes it: NCCL, on the GPU
        self.device = (
            torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        )
        self._where: tuple[tuple[int, ...], torch.Tensor] | None = None

    def layout(self, step: int) -> tuple[bool, bool, bool]:
        """Which blocks a step's vector holds: the same on every rank, from the count."""
        options = self.options
        layer = due(step, options.layer_every)
        return due(step, options.every) or layer, layer, layer and options.update_ratio

    def after_step(self, row: Row | None, failed: bool) -> None:
        """At every optimizer step post-hook of every rank; `row`: this step's, if the
        probe has it (None on a failed rank). Never raises, and issues the all-reduce
        whatever happens before it: a rank that did not would leave the others waiting."""
        step, self.step = self.step, self.step + 1
        grads, layer, update = self.layout(step)
        if not (grads or layer):
            return
        n, t = self.n, self.trainable
        size = 1 + 2 * n * grads + n * layer + 2 * t * update
        ok = not failed and row is not None and row.step == step
        vector = None
        if ok:
            try:
                vector = self._squares(row, grads, layer, update)  # type: ignore[arg-type]
            except Exception:
                vector = None
        if vector is None or vector.numel() != size:
            vector = torch.zeros(size, device=self.device)
            vector[0] = 1.0  # this rank has no norms to give: the step's sums are left out
            ok = False
        try:
            torch.distributed.all_reduce(vector)  # queued: on NCCL the host does not wait
        except Exception:  # the process group is gone (a peer died): nothing to wait for
            ok = False
        if row is None:
            return
        try:
            if ok:
                self._put(row, vector, grads, layer, update)
            else:
                drop(row)
        except Exception:
            drop(row)

    def _squares(self, row: Row, grads: bool, layer: bool, update: bool) -> torch.Tensor:
        """[flag 0, squared grad norms, had a grad, squared weight norms, squared update
        norms], the blocks the layout asks for, zeros where this rank has nothing."""
        chunks = dict(zip(row.names, row.chunks, strict=True))
        device, n, t = self.device, self.n, self.trainable
        blocks = [torch.zeros(1, device=device)]
        if grads:
            squares = torch.zeros(n, device=device)
            has = torch.zeros(n, device=device)
            norms = chunks.get("grad_params")
            if norms is not None:
                where = self._where_of(row.host["grad_indices"])
                squares[where] = norms.to(device) ** 2
                has[where] = 1.0
            blocks += [squares, has]
        if layer:
            weights = chunks.get("param_norms")
            blocks.append(torch.zeros(n, device=device) if weights is None else weights**2)
        if update:
            moved = chunks.get("update")
            fits = moved is not None and moved.numel() == 2 * t
            blocks.append(moved.to(device) ** 2 if fits else torch.zeros(2 * t, device=device))  # type: ignore[union-attr]
        return torch.cat([b.to(device) for b in blocks])

    def _where_of(self, indices: list[int]) -> torch.Tensor:
        """The indices on the device, made once: a list copied to a GPU from pageable
        memory waits for the device's queue, and the same parameters have gradients
        step after step."""
        key = tuple(indices)
        if self._where is None or self._where[0] != key:
            self._where = (key, torch.tensor(key, device=self.device))
        return self._where[1]

    def _put(self, row: Row, summed: torch.Tensor, grads: bool, layer: bool, update: bool) -> None:
        had = set(row.names)
        drop(row)
        row.put(FLAG, summed[:1])
        n, t, at = self.n, self.trainable, 1
        if grads:
            if "grad_params" in had:
                row.host["grad_indices"] = list(range(n))  # narrowed on the host (on_host)
                row.put("grad_params", summed[at : at + n].sqrt())
                row.put(HAS, summed[at + n : at + 2 * n])
            at += 2 * n
        if layer:
            if "param_norms" in had:
                row.put("param_norms", summed[at : at + n].sqrt())
            at += n
        if update and "update" in had:
            row.put("update", summed[at : at + 2 * t].sqrt())


def drop(row: Row) -> None:
    """Leaves a row's shard norms out: they are no model's norms on their own."""
    for name in _CHUNKS:
        row.remove(name)


def on_host(row: Row, values: dict[str, list[float]]) -> dict[str, list[float]]:
    """A row's values as the renderer takes them: the sums of a step some rank could not
    give its norms for left out, and gradients narrowed to the parameters that had one."""
    flag = values.get(FLAG)
    if flag is None:
        return values
    if flag[0] > 0:
        global _said
        if not _said:
            _said = True
            log.warning(
                "trainsentry probe: a rank could not give its shards' norms at step %d "
                "(its probe failed, or steps were renumbered off the optimizer's count): "
                "gradient and weight norms of such steps are left out",
                row.step,
            )
        return {k: v for k, v in values.items() if k not in _CHUNKS}
    has = values.get(HAS)
    out = {k: v for k, v in values.items() if k not in (HAS, FLAG)}
    if has is not None and "grad_params" in out:
        keep = [i for i, h in enumerate(has) if h > 0]
        row.host["grad_indices"] = keep
        out["grad_params"] = [out["grad_params"][i] for i in keep]
    return out
