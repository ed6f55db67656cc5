"""Hugging Face Trainer adapter: `Trainer(..., callbacks=[TrainsentryCallback()])`.

Imported only by users who ask for it; the core never imports transformers.
HF models return their loss, which the probe captures from the forward pass
(averaged over gradient-accumulation micro-batches). The probe's steps are
numbered as HF numbers its logs (`state.global_step` after the step), and a
stop file sets `control.should_training_stop`, so the Trainer ends cleanly
and saves as configured.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.integrations import TensorBoardCallback
from transformers.integrations.integration_utils import default_logdir
from transformers.trainer_callback import CallbackHandler

from trainsentry_probe import watch
from trainsentry_probe.probe import Probe


def _peer_callbacks() -> list[Any]:
    """The Trainer's callbacks, taken from the CallbackHandler calling this one.

    HF hands a callback neither the Trainer nor its peers, and the directory
    the TensorBoard callback writes to exists only on that callback (since
    transformers 5 it is no longer `args.logging_dir`); the handler is a few
    frames up, in `call_event`."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(10):
        if frame is None:
            break
        handler = frame.f_locals.get("self")
        if isinstance(handler, CallbackHandler):
            return list(handler.callbacks)
        frame = frame.f_back
    return []


def _tensorboard_dir(args: TrainingArguments, callbacks: list[Any]) -> str | None:
    """Where the Trainer's TensorBoard writer logs this run; None without one."""
    tensorboard = next((c for c in callbacks if isinstance(c, TensorBoardCallback)), None)
    if tensorboard is None:
        return None
    writer = getattr(tensorboard, "tb_writer", None)
    if writer is not None and hasattr(writer, "get_logdir"):  # it began first (the usual order)
        return str(writer.get_logdir())
    legacy = getattr(args, "logging_dir", None)
    if legacy:  # transformers 4: the writer will open args.logging_dir
        return str(legacy)
    if tensorboard.logging_dir is None:
        # This callback runs first: fix the directory for both, as the
        # TensorBoard callback would (it keeps a directory already set).
        tensorboard.logging_dir = os.path.join(args.output_dir or ".", default_logdir())
    return str(tensorboard.logging_dir)


def _rank0s(logdir: str) -> str:
    """Rank 0's directory on every rank: the TensorBoard callback resolves it on
    rank 0 only, and a dated name made on another rank can differ (by a second,
    or by the host name on another node), so the other ranks' files and the
    stop file looked for would be another run's."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return logdir
    shared = [logdir]
    dist.broadcast_object_list(shared, src=0)
    return str(shared[0])


class TrainsentryCallback(TrainerCallback):
    """Watches the Trainer's model and optimizer from train begin to train end.

    `logdir` defaults to the directory the Trainer's TensorBoard writer logs
    to (`report_to` with "tensorboard"), so the daemon sees the probe's file
    and HF's event file as one run, and the stop file a rule writes for that
    run is the one `should_stop()` checks. Without TensorBoard it is the
    output directory (see `on_train_begin`). Other keywords are `watch()`
    options.
    """

    def __init__(self, logdir: str | Path | None = None, **options: Any) -> None:
        self.logdir = logdir
        self.options = options
        self.probe: Probe | None = None

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: Any = None,
        optimizer: Any = None,
        **kwargs: Any,
    ) -> None:
        if model is None:
            return
        # Without a TensorBoard writer, the output directory: there the user
        # finds trainer_state.json and the checkpoints, and a run resumed from
        # one of them continues the same probe file (one job, one run). The
        # dated `logging_dir` of transformers 4 would hold nothing but the
        # probe's file, a new directory (and run) at each restart.
        logdir = self.logdir or _tensorboard_dir(args, _peer_callbacks()) or args.output_dir
        if self.logdir is None:
            logdir = _rank0s(str(logdir))
        options = dict(self.options)
        options.setdefault("start_step", state.global_step + 1)
        options.setdefault("seed", args.seed)
        options.setdefault(
            "hparams",
            {
                "learning_rate": args.learning_rate,
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "max_steps": args.max_steps,
                "num_train_epochs": args.num_train_epochs,
                "weight_decay": args.weight_decay,
            },
        )
        options.setdefault("grad_scaler", getattr(optimizer, "scaler", None))  # accelerate, fp16
        self.probe = watch(model, optimizer, str(logdir), **options)

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.probe is not None:
            self.probe.begin_step()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.probe is not None and self.probe.should_stop():
            control.should_training_stop = True

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, float] | None = None,
        **kwargs: Any,
    ) -> None:
        if self.probe is not None and metrics and "eval_loss" in metrics:
            self.probe.record(val_loss=metrics["eval_loss"])

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.probe is not None:
            self.probe.close()
