"""Hugging Face Trainer adapter: `Trainer(..., callbacks=[TrainsentryCallback()])`.

Imported only by users who ask for it; the core never imports transformers.
HF models return their loss, which the probe captures from the forward pass
(averaged over gradient-accumulation micro-batches). The probe's steps are
numbered as HF numbers its logs (`state.global_step` after the step), and a
stop file sets `control.should_training_stop`, so the Trainer ends cleanly
and saves as configured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainsentry_probe import watch
from trainsentry_probe.probe import Probe


class TrainsentryCallback(TrainerCallback):
    """Watches the Trainer's model and optimizer from train begin to train end.

    `logdir` defaults to the Trainer's logging directory (its TensorBoard
    logs, where the daemon already looks), else its output directory; other
    keywords are `watch()` options.
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
        logdir = self.logdir or getattr(args, "logging_dir", None) or args.output_dir
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
