"""The probe: hooks that turn a training loop's steps into probe records.

Where each statistic is taken, and why there:

- the root module's forward pre-hook opens a step: the time since the last
  optimizer step ended is data wait (the loop was fetching the batch), and a
  sampled step arms the activation hooks before any child module runs; the
  step's first forward is timed from the end of this hook (clock.py);
- its forward hook ends that timing, captures the loss when the model
  returns one (HF models, many Lightning modules) and disarms the activation
  hooks;
- gradient norms are taken when backward ends (a hook on the model's output
  queues a callback on the autograd engine; in a distributed job it queues
  itself once more, so it runs after DDP's own end-of-backward callback has
  written the averaged gradients): gradients are
  complete and still *before clipping*, so an explosion that
  clip_grad_norm_ hides from the optimizer is still visible, and the total
  equals what clip_grad_norm_ returns (HF's and Lightning's logged norm).
  With gradient accumulation the last backward of the step wins. Where no
  backward was seen (the loss does not flow through the watched module's
  output), the optimizer's step hooks take them instead;
- the optimizer's step pre-hook copies the weights (layer-statistics steps
  only);
- the optimizer's step post-hook closes the step: update ratios, parameter
  norms, step time, learning rate.

In a distributed job every rank writes a file of its own (records.file_name).
Rank 0 records every tier; the other ranks record the per-step timing and
their loss only, unless `all_ranks=True` (then every rank records
everything): they keep the step hooks above, watch backward only to see a
GradScaler's skipped steps, and take no statistics. A sharded model is the
exception: its norms need every rank's shards, so every rank takes them (and
runs the one all-reduce, sharded.py) and only the writing differs. Which
ranks issue a collective never depends on what they write.

A step's row stays open for late values until the next step's forward
begins, so `probe.record(loss=loss)` may come before or after
`optimizer.step()`. Forward passes outside training (`model.eval()` or
`torch.no_grad()`, as in validation) are ignored.

The probe must never break training: every hook body is guarded, and a
failure logs once, removes all hooks and leaves the loop running unobserved.
Module hooks run outside torch.compile's graphs (attach.eager). What a step's
row holds is steps.py's business; this module only wires the hooks.
"""

from __future__ import annotations

import atexit
import functools
import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainsentry_probe.activations import ActivationSampler
from trainsentry_probe.amp import ScalerWatch
from trainsentry_probe.attach import (
    batch_size,
    eager,
    first_grad_tensor,
    guarded,
    unwrap_model,
    unwrap_optimizer,
)
from trainsentry_probe.gpu import NvmlSampler
from trainsentry_probe.layers import LayerMap
from trainsentry_probe.losses import as_value, loss_of, spread
from trainsentry_probe.meta import end_record, meta_record, new_run_id, rank_and_world_size
from trainsentry_probe.options import ProbeOptions, due
from trainsentry_probe.records import RecordRenderer, file_name
from trainsentry_probe.sharded import ShardSum, is_sharded
from trainsentry_probe.steps import Steps
from trainsentry_probe.stopfile import (
    StopRequest,
    StopWatch,
    TrainingStopped,
    agree_across_ranks,
    stop_file_path,
)
from trainsentry_probe.transfer import Transfer
from trainsentry_probe.writer import RecordWriter

log = logging.getLogger("trainsentry_probe")


class Probe:
    """Watches one model and optimizer; see `trainsentry_probe.watch`."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: Any,
        logdir: str | Path,
        options: ProbeOptions,
    ) -> None:
        self.options = options
        self.logdir = Path(logdir)
        self.rank, self.world_size = rank_and_world_size()
        dist = torch.distributed
        distributed = dist.is_available() and dist.is_initialized()
        inner = unwrap_model(model)  # names and inner hooks; the step hooks sit on `model`
        # every tier on rank 0 (or every rank with all_ranks); timing and loss elsewhere
        self.full = options.all_ranks or self.rank == 0 or self.world_size < 2
        # A sharded model's norms need every rank's shards (sharded.py): every rank
        # takes them, and the ones that record timing only leave them out of their file.
        sharded = distributed and is_sharded(inner)
        statistics = self.full or sharded
        self._statistics = statistics
        self.failed: BaseException | None = None
        self.closed = False
        stop_path = stop_file_path(self.logdir, options.control_dir, options.stop_file)
        self._stop = StopWatch(stop_path, options.stop_every, started=time.time())
        self._handles: list[RemovableHandle] = []
        self.path = self.logdir / file_name(self.rank, self.world_size)
        self.model = model
        self.optimizer = unwrap_optimizer(optimizer)
        first = next(inner.parameters(), None)
        self.device = first.device if first is not None else torch.device("cpu")
        self.layers = LayerMap(inner)
        self.layers.sharded = sharded
        sampling = statistics and options.activations and options.sample_every
        self.sampler = ActivationSampler(inner) if sampling else None
        every = options.transfer_every or 20
        meta = functools.partial(
            meta_record,
            run_id=options.run_id or new_run_id(),
            logdir=str(self.logdir),
            rank=self.rank,
            world_size=self.world_size,
            device=self.device,
            seed=options.seed if options.seed is not None else torch.initial_seed(),
            hparams=dict(options.hparams),
            options=options.as_dict(),
            layers=list(self.layers.names),
        )
        renderer = RecordRenderer(self.layers, timing_only=not self.full)
        self._writer = RecordWriter(self.path, meta, renderer.render)
        self.amp = ScalerWatch(options.grad_scaler)
        # DDP writes the averaged gradients in an end-of-backward callback of its own
        self._backward_end = self._requeue if distributed else self._on_backward_end
        self.steps = Steps(
            options,
            self.layers,
            self.sampler,
            self.amp,
            Transfer(self.device, every, options.transfer_seconds),
            self._writer,
            self.device,
            statistics=statistics,
        )
        # backward's end is watched for gradients, and for the GradScaler's skips
        self._watch_backward = statistics or self.amp.active
        if statistics:
            self.layers.learn_order(inner)
        self._handles += [
            model.register_forward_pre_hook(eager(self._on_forward_pre), with_kwargs=True),
            model.register_forward_hook(eager(self._on_forward), with_kwargs=True),
        ]
        if self.optimizer is not None:
            self._handles += [
                self.optimizer.register_step_pre_hook(self._on_step_pre),
                self.optimizer.register_step_post_hook(self._on_step_post),
            ]
        self._shards: ShardSum | None = None
        self._shards_handle: RemovableHandle | None = None
        if sharded:
            self._sum_shards_on_every_rank()
        gpu_seconds = options.gpu_sample_seconds if self.full else 0.0
        self._nvml = NvmlSampler.start_for(self.device, gpu_seconds, self._emit_gpu)
        atexit.register(self._close_at_exit)

    def _sum_shards_on_every_rank(self) -> None:
        """The all-reduce of the shards' norms, at a hook of its own that outlives a
        failure of the others: it is registered after them (it reads the row they
        close) and removed only at close."""
        if self.optimizer is None:
            self._fail(
                RuntimeError(
                    "a sharded model's norms are summed at the optimizer's step: "
                    "call trainsentry_probe.watch(model, optimizer, logdir) on every rank"
                )
            )
            return
        trainable = sum(self.layers.trainable)
        self._shards = ShardSum(len(self.layers.params), trainable, self.options)
        self._shards_handle = self.optimizer.register_step_post_hook(self._after_step_sums)

    def _after_step_sums(self, *_: Any) -> None:
        shards = self._shards
        if shards is None or self.closed:
            return
        failed = self.failed is not None
        shards.after_step(None if failed else self.steps.last, failed)

    @property
    def step(self) -> int:
        """The number the current (or next) step gets."""
        return self.steps.step

    # --- hooks ---------------------------------------------------------------

    @guarded
    def _on_forward_pre(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        steps = self.steps
        steps.close_skipped(self.optimizer)
        if not steps.in_step:
            steps.begin(time.perf_counter())
        steps.forward_seen(batch_size(args, kwargs))
        steps.forward_starts()  # last: the probe's own work above is not the forward's

    @guarded
    def _on_forward(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        if not module.training or not torch.is_grad_enabled():
            return
        row = self.steps.current()
        self.steps.forward_ends(row)
        self.amp.mark()
        if self.sampler is not None and self.sampler.armed:
            for name, value in self.sampler.disarm():
                row.put(f"act:{name}", value)
        loss = loss_of(output)
        if loss is not None and due(row.step, self.options.every):
            row.add_loss(loss, explicit=False)
        watched = first_grad_tensor(output) if self._watch_backward else None
        if watched is not None:
            watched.register_hook(self._on_backward_start)

    def _on_backward_start(self, grad: torch.Tensor) -> None:
        """A tensor hook (returns None: the gradient passes unchanged)."""
        if self.failed is None and not self.closed:
            engine = torch.autograd.Variable._execution_engine
            engine.queue_callback(self._backward_end)

    def _requeue(self) -> None:
        """Runs as backward ends; goes to the back of the queue once more, behind the
        callbacks queued during backward (DDP's, which writes the averaged gradients)."""
        if self.failed is None and not self.closed:
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)

    @guarded
    def _on_backward_end(self) -> None:
        if self.steps.in_step and self.steps.open is not None:
            self.amp.mark()
            self.steps.take_gradients(self.steps.open, self.optimizer)

    @guarded
    def _on_step_pre(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        row = self.steps.current()
        self.steps.before_optimizer_step(row)
        closure = args[0] if args else kwargs.get("closure")
        if closure is None and not self.steps.grads_taken:
            self.steps.take_gradients(row, optimizer)

    @guarded
    def _on_step_post(
        self, optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        row = self.steps.current()
        if not self.steps.grads_taken:
            self.steps.take_gradients(row, optimizer)
        self.steps.after_optimizer_step(row, optimizer)

    def _emit_gpu(self, values: dict[str, float]) -> None:
        """From the NVML thread: a record of its own, at the latest step."""
        record: dict[str, Any] = {"step": max(self.step - 1, 0), "time": time.time()}
        record.update({f"probe/{k}": v for k, v in values.items()})
        self._writer.put(record)

    def _fail(self, exc: BaseException) -> None:
        self.failed = exc
        log.warning("trainsentry probe disabled after an internal error: %r", exc, exc_info=exc)
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self.sampler is not None:
            self.sampler.disarm()
        self.layers.order_learned()

    # --- public --------------------------------------------------------------

    def record(
        self,
        step: int | None = None,
        *,
        loss: Any = None,
        per_sample_loss: torch.Tensor | None = None,
        **scalars: Any,
    ) -> None:
        """Adds values to a step: the one in progress, or the one just ended.

        `loss` (a tensor or number; the mean over calls within one step, as with
        gradient accumulation), `per_sample_loss` (unreduced losses; summarised
        on sampled steps only) and any other scalars (written as `probe/<name>`,
        e.g. `val_loss`). `step` renumbers the step (and the ones after it).
        Without an optimizer the call *is* the step boundary: call it after
        backward and before zero_grad, so gradients can be measured. A rank that
        records timing only keeps the loss and the step number of these.
        """
        if self.closed or self.failed is not None:
            return
        # a rank that records timing only drops what it would not write; a sharded
        # model's ranks keep it all, as a DTensor's reductions are collectives
        if not self._statistics:
            per_sample_loss, scalars = None, {}
        self._record(step, loss, per_sample_loss, scalars)

    @guarded
    def _record(
        self,
        step: int | None,
        loss: Any,
        per_sample_loss: torch.Tensor | None,
        scalars: dict[str, Any],
    ) -> None:
        steps = self.steps
        row = steps.late()
        if step is not None and step != row.step:
            steps.step += step - row.step
            row.step = step
        value = as_value(loss)
        if value is not None and due(row.step, self.options.every):
            row.add_loss(value, explicit=True)
        if per_sample_loss is not None and row.host.get("sampled"):
            summary = spread(per_sample_loss)
            if summary is not None:
                row.put("sample_loss", summary)
        for name, given in scalars.items():
            got = as_value(given)
            if isinstance(got, torch.Tensor):
                row.put(f"x:{name}", got)
            elif got is not None:
                row.host.setdefault("extra", {})[name] = got
        if self.optimizer is None:  # standalone: this call is the step boundary
            if row is steps.open:
                steps.take_gradients(row, None)
                steps.end(row, None)
            steps.seal_last()

    def begin_step(self) -> None:
        """Marks the start of a step (data wait ends here), for trainers whose
        training step does not call the watched module itself (Lightning's
        training_step calling a submodule); forward hooks do this otherwise."""
        if not self.closed and self.failed is None:
            self._begin_now()

    @guarded
    def _begin_now(self) -> None:
        self.steps.close_skipped(self.optimizer)
        if not self.steps.in_step:
            self.steps.begin(time.perf_counter())

    def before_backward(self, loss: torch.Tensor) -> None:
        """Takes gradient statistics when the backward of `loss` ends (before any
        clipping), for trainers whose loss does not come out of the watched
        module's forward (Lightning's training_step)."""
        watch = self._watch_backward and not self.closed and self.failed is None
        if watch and loss.requires_grad:
            loss.register_hook(self._on_backward_start)

    def sample_next(self) -> None:
        """Takes activation (and per-sample loss) statistics on the next step too,
        whatever the cadence: for per-epoch sampling."""
        self.steps.sample_requested = True

    def flush(self) -> None:
        """Sends every sealed step to the writer (the open one stays open)."""
        if not self.closed:
            self.steps.flush()

    def should_stop(self, raise_error: bool | None = None) -> bool:
        """Whether the daemon asked this run to stop (see stopfile.py).

        Cheap: one stat every `stop_every` calls. With `raise_error` (default:
        the `raise_on_stop` option) a stop raises TrainingStopped instead of
        returning True. In a distributed job every rank must call this at the
        same iterations: the ranks agree (all_reduce MAX) on checking
        iterations, so all stop together rather than leave one in a collective.
        """
        request = self._stop.request
        if request is None and self._stop.due():
            try:
                request = self._stop.look()
                request = agree_across_ranks(request, self._stop)
            except Exception as exc:
                log.warning("trainsentry probe: stop check failed: %r", exc)
                request = None
        if request is None:
            return False
        if raise_error if raise_error is not None else self.options.raise_on_stop:
            raise TrainingStopped(request)
        return True

    @property
    def stop_request(self) -> StopRequest | None:
        return self._stop.request

    def close(self, error: BaseException | None = None) -> None:
        """Writes every pending record, then the end record, and removes the hooks;
        idempotent. `error`: the exception the training ended on, if it did (the
        end record says so: the daemon then knows a crash from a finished run)."""
        if self.closed:
            return
        self.closed = True
        atexit.unregister(self._close_at_exit)
        self._remove_hooks()
        if self._shards_handle is not None:
            self._shards_handle.remove()
        try:
            if self._nvml is not None:
                self._nvml.stop()
            if self.failed is None and self.optimizer is not None:
                self.steps.close_skipped(self.optimizer)
            self.steps.finish()
        except Exception as exc:
            log.warning("trainsentry probe: records lost at close: %r", exc)
        self._writer.put(end_record(max(self.step - 1, 0), error))
        self._writer.close()

    def _close_at_exit(self) -> None:
        """At interpreter exit: Python keeps the exception that ended the program in
        `sys.last_value` before it runs atexit handlers, so an uncaught one is told."""
        last = getattr(sys, "last_value", None)
        self.close(last if isinstance(last, BaseException) else None)

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> None:
        self.close(error)
