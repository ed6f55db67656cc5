"""The probe's steps: which row a value belongs to, and what a step's row holds.

The hooks (probe.py) say *when* something happened: a training forward
began, backward ended, the optimizer is about to step or has stepped. This
module decides what that means for the rows: a forward outside a step opens
one, backward's end takes the gradient norms, the optimizer's step closes the
row with weight statistics and timing. A closed row stays open for late
values (`probe.record(loss=...)` after `optimizer.step()`) until the next
step begins, then it is sealed and queued for the one batched transfer.

Which tier runs at a step is decided here from the step number alone, so a
step that records nothing launches nothing on the device. A rank that records
only timing and loss (`statistics=False`: ranks > 0 of a distributed job
without `all_ranks`, a sharded model's excepted) takes no gradient, weight or
activation statistics at all; its steps hold the timing, `forward_time` (clock.py) and the loss.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from trainsentry_probe import gradients
from trainsentry_probe.activations import ActivationSampler
from trainsentry_probe.amp import ScalerWatch, found_inf
from trainsentry_probe.clock import ForwardClock
from trainsentry_probe.gpu import cuda_memory
from trainsentry_probe.layers import LayerMap
from trainsentry_probe.options import ProbeOptions, due
from trainsentry_probe.transfer import Row, Transfer
from trainsentry_probe.writer import RecordWriter


class Steps:
    """The step in progress and the one just ended, and how they become records."""

    def __init__(
        self,
        options: ProbeOptions,
        layers: LayerMap,
        sampler: ActivationSampler | None,
        amp: ScalerWatch,
        transfer: Transfer,
        writer: RecordWriter,
        device: torch.device,
        *,
        statistics: bool = True,
    ) -> None:
        self.options = options
        self.layers = layers
        self.sampler = sampler
        self.amp = amp
        self.transfer = transfer
        self.writer = writer
        self.device = device
        self.statistics = statistics  # gradient, weight, activation statistics; else timing
        self.clock = ForwardClock(device)
        self.step = options.start_step  # the number the current (or next) step gets
        self.open: Row | None = None  # the step in progress
        self.last: Row | None = None  # the step just ended, open for late values
        self.in_step = False
        self.grads_taken = False
        self.sample_requested = False
        self._t_begin: float | None = None
        self._t_end: float | None = None
        self._snapshot: gradients.Snapshot | None = None
        self._batch = 0
        self._order_pending = True

    def current(self) -> Row:
        """The row of the step in progress, opening one if no forward was seen."""
        if not self.in_step:
            self.begin(None)
        assert self.open is not None
        return self.open

    def late(self) -> Row:
        """Where a value given now belongs: the step in progress, else the one just ended."""
        if self.in_step and self.open is not None:
            return self.open
        return self.last or self.current()

    def begin(self, now: float | None) -> None:
        self.seal_last()
        row = Row(step=self.step)
        timed = due(row.step, self.options.every)
        if now is not None and self._t_end is not None and timed:
            row.host["data_wait"] = now - self._t_end
        self.clock.arm(timed)
        self._t_begin = now
        self.open, self.in_step = row, True
        if not self.statistics:
            return
        if due(row.step, self.options.sample_every) or self.sample_requested:
            self.sample_requested = False
            row.host["sampled"] = True
            if self.sampler is not None:
                self.sampler.arm()

    def forward_seen(self, batch: int) -> None:
        self._batch += batch

    def close_skipped(self, optimizer: Any) -> None:
        """Ends the step in progress if the grad scaler skipped its optimizer step."""
        if self.in_step and self.amp.skipped():
            row = self.current()
            row.host["skipped"] = True
            self.end(row, lr_of(optimizer))

    def forward_starts(self) -> None:
        self.clock.start()

    def forward_ends(self, row: Row) -> None:
        self.clock.stop(row.host)

    def take_gradients(self, row: Row, optimizer: Any) -> None:
        self.grads_taken = True
        layer_step = due(row.step, self.options.layer_every)
        if not self.statistics or not (due(row.step, self.options.every) or layer_step):
            return
        if self._order_pending:
            self._order_pending = False
            self.layers.order_learned()
        stats = gradients.gradient_step(self.layers, self.device)
        if stats is None:
            return
        scale = self.amp.scale()
        if scale is not None:
            if self.amp.scaled(optimizer):
                stats.per_param = stats.per_param / scale.to(stats.per_param.device)  # async
            row.replace("grad_scale", scale * 1)  # a copy: update() changes the scale in place
        row.replace("grad_params", stats.per_param)
        row.host["grad_indices"] = stats.indices
        row.host["layer_step"] = layer_step

    def before_optimizer_step(self, row: Row) -> None:
        options = self.options
        if self.statistics and due(row.step, options.layer_every) and options.update_ratio:
            self._snapshot = gradients.snapshot(self.layers, self.options.update_sample)

    def after_optimizer_step(self, row: Row, optimizer: Any) -> None:
        flag = found_inf(optimizer) if self.statistics else None
        if flag is not None and due(row.step, self.options.every):
            row.put("found_inf", flag)
        self.end(row, lr_of(optimizer))

    def end(self, row: Row, lr: Any) -> None:
        """Closes a step: weight statistics, timing; the row stays open for late values."""
        options = self.options
        if not self.statistics:
            lr = None
        if self._snapshot is not None:
            row.put("update", gradients.update_norms(self.layers, self._snapshot, self.device))
            row.host["update_indices"] = self._snapshot.indices
            self._snapshot = None
        if self.statistics and due(row.step, options.layer_every):
            row.put("param_norms", gradients.param_norms(self.layers, self.device))
            row.host.update(cuda_memory(self.device))
        if self.sampler is not None and row.host.get("sampled"):
            for name, value in self.sampler.disarm() + self.sampler.embedding_stats():
                row.put(f"act:{name}", value)
        now = time.perf_counter()
        if due(row.step, options.every) or row.host.get("skipped"):
            if self.amp.active:
                row.host["amp"] = True
            start = self._t_end if self._t_end is not None else self._t_begin
            if start is not None and now > start:
                row.host["step_time"] = now - start
                if self._batch:
                    row.host["samples_per_second"] = self._batch / (now - start)
            if isinstance(lr, torch.Tensor):
                row.put("lr", lr * 1)  # a copy: a scheduler may change it in place
            elif isinstance(lr, (int, float)):
                row.host["lr"] = float(lr)
        row.time = time.time()
        self._t_end = now
        self._batch = 0
        self.grads_taken = False
        self.amp.clear()
        self.last, self.open, self.in_step = row, None, False
        self.step += 1

    def seal_last(self) -> None:
        if self.last is not None:
            row, self.last = self.last, None
            batch = self.transfer.add(row)
            if batch is not None:
                self.writer.put(batch)

    def flush(self) -> None:
        """Sends every sealed step to the writer (the open one stays open)."""
        batch = self.transfer.send()
        if batch is not None:
            self.writer.put(batch)

    def finish(self) -> None:
        """At close: the step in progress ends as it is, and everything is sent."""
        if self.in_step and self.open is not None:
            self.seal_last()
            self.last, self.open = self.open, None
        self.seal_last()
        self.flush()


def lr_of(optimizer: Any) -> Any:
    groups = getattr(optimizer, "param_groups", None)
    return groups[0].get("lr") if groups else None
