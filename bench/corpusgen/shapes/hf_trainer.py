"""HF Trainer runs: `report_to=["tensorboard"]`, everything else as the Trainer defaults.

The model is a PreTrainedModel built from its config (no download); the
Trainer's own TensorBoardCallback writes `train/loss` (the mean since the
last log), `train/grad_norm` (pre-clip, max_grad_norm=1), the linear-decay
learning rate and `eval/loss` under output_dir/runs/<date>_<host>/. Faults
come in through a TrainerCallback: the lr through the scheduler's base lr
(the Trainer re-derives the lr from it every step), labels and NaNs through
forward hooks on the model, freezing through requires_grad.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    PrinterCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import logging as hf_logging

from corpusgen.shapes import task
from corpusgen.shapes.spec import ShapeRun, is_freeze_step, is_nan_step, lr_factor


class TinyConfig(PretrainedConfig):
    model_type = "trainsentry_tiny_classifier"

    def __init__(self, width: int = 64, num_labels: int = task.CLASSES, **kw: Any) -> None:
        super().__init__(num_labels=num_labels, **kw)
        self.width = width


class TinyClassifier(PreTrainedModel):
    """The shared Body as a PreTrainedModel: the Trainer's contract (loss in the output)."""

    config_class = TinyConfig
    base_model_prefix = "net"

    def __init__(self, config: TinyConfig) -> None:
        super().__init__(config)
        self.net = task.Body(config.width)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """torch's own initialisation (what Body gets everywhere else)."""

    def forward(
        self, x: torch.Tensor, labels: torch.Tensor | None = None
    ) -> SequenceClassifierOutput:
        logits = self.net(x)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


class Split(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Faults(TrainerCallback):
    """The run's fault, applied at the step the Trainer is about to take."""

    def __init__(self, run: ShapeRun, monitor: task.Monitor) -> None:
        self.run = run
        self.monitor = monitor
        self.applied = 1.0
        self.rng = np.random.default_rng(9000 + run.seed)
        self.nan: torch.utils.hooks.RemovableHandle | None = None
        self.step_loss = float("nan")
        self.step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        model: nn.Module = kw["model"]
        model.register_forward_pre_hook(self._labels, with_kwargs=True)
        model.register_forward_hook(self._loss)

    def _labels(self, module: nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        labels = kwargs.get("labels")
        if not module.training or labels is None:
            return None
        y = task.noisy_labels(self.run, self.step, labels.numpy(), self.rng)
        return args, {**kwargs, "labels": torch.from_numpy(y)}

    def _loss(self, module: nn.Module, _args: Any, out: SequenceClassifierOutput) -> None:
        if module.training and out.loss is not None:
            self.step_loss = float(out.loss.detach())

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.step = step = state.global_step + 1
        factor = lr_factor(self.run, step)
        if factor != self.applied:
            scheduler, optimizer = kw["lr_scheduler"], kw["optimizer"]
            ratio = factor / self.applied
            scheduler.base_lrs = [lr * ratio for lr in scheduler.base_lrs]
            for group in optimizer.param_groups:
                group["lr"] *= ratio
            self.applied = factor
        if is_nan_step(self.run, step):
            self.nan = task.poison_hook(kw["model"])
        if is_freeze_step(self.run, step):
            task.freeze_all_but_head(kw["model"])

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.nan is not None:
            self.nan.remove()
            self.nan = None
        if self.monitor.step_done(state.global_step, self.step_loss):
            control.should_training_stop = True


def train(run: ShapeRun, run_dir: Path, monitor: task.Monitor) -> dict[str, object]:
    """Train `run` into `run_dir`; return where the Trainer put what (for the label)."""
    hf_logging.set_verbosity_error()
    torch.manual_seed(run.seed)
    data = task.clusters(run.seed, run.train_size)
    model = TinyClassifier(TinyConfig(width=run.width))
    if run.trap == "slow_finetune":
        task.pretrain(model.net, data, run.seed)
    shape = run.spec
    extra: dict[str, Any] = {}
    if shape.log_every != 500:  # 500 is the Trainer's default; leave it unset there
        extra["logging_steps"] = shape.log_every
        extra["eval_steps"] = shape.eval_every
    args = TrainingArguments(
        output_dir=str(run_dir),
        report_to=["tensorboard"],
        max_steps=run.steps,
        per_device_train_batch_size=run.batch,
        per_device_eval_batch_size=256,
        learning_rate=run.lr,
        weight_decay=run.weight_decay,
        eval_strategy="steps",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=run.seed,
        **extra,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Split(data.x, data.y),
        eval_dataset=Split(data.val_x, data.val_y),
        callbacks=[Faults(run, monitor)],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    logdir = next(p.parent for p in sorted(run_dir.rglob("events.out.tfevents.*")))
    sub = logdir.relative_to(run_dir).as_posix()
    return {
        "framework_version": _version(),
        "series": {
            "loss": [sub, "train/loss"],
            "val_loss": [sub, "eval/loss"],
            "grad_norm": [sub, "train/grad_norm"],
            "lr": [sub, "train/learning_rate"],
        },
        "epoch_axis": None,
    }


def _version() -> str:
    import transformers

    return f"transformers {transformers.__version__}"
