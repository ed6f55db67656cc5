"""Lightning runs: `Trainer.fit` with a TensorBoardLogger or a CSVLogger and default cadence.

The LightningModule logs what the Lightning docs show, `self.log("train_loss",
loss)` in training_step and `self.log("val_loss", loss)` in validation_step;
the Trainer writes the former every `log_every_n_steps` (default 50) and the
latter, averaged over the validation loop, at each `val_check_interval`.
A shape with `grad_norms` adds the docs' recipe for tracking gradients,
`self.log_dict(grad_norm(self, norm_type=2))` in on_before_optimizer_step:
`grad_2.0_norm/<param>` for each parameter that has a gradient, and the total.
A shape with `lr_monitor` adds LearningRateMonitor(logging_interval="step"),
whose `lr-AdamW` comes before the step's loss in each record.
Loggers write where a default user's do: <run>/lightning_logs/version_0/.
Faults come in through a Callback: the optimizer's lr, the batch (labels
edited in place before training_step sees them), a forward hook for NaN,
requires_grad for freezing.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import grad_norm
from torch import nn

from corpusgen.shapes import deep, task
from corpusgen.shapes.spec import ShapeRun, is_freeze_step, is_nan_step, lr_factor


class Classifier(L.LightningModule):
    def __init__(self, net: nn.Module, lr: float, weight_decay: float, grad_norms: bool) -> None:
        super().__init__()
        self.net = net
        self.lr = lr
        self.weight_decay = weight_decay
        self.grad_norms = grad_norms

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.grad_norms:
            self.log_dict(grad_norm(self, norm_type=2))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _i: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], _i: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), self.lr, weight_decay=self.weight_decay)


class Faults(L.Callback):
    """The run's fault, applied to the batch the Trainer is about to train on."""

    def __init__(self, run: ShapeRun, monitor: task.Monitor) -> None:
        self.run = run
        self.monitor = monitor
        self.rng = np.random.default_rng(9000 + run.seed)
        self.nan: torch.utils.hooks.RemovableHandle | None = None

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        for group in trainer.optimizers[0].param_groups:
            group["lr"] = self.run.lr * lr_factor(self.run, step)
        y = batch[1]
        y.copy_(torch.from_numpy(task.noisy_labels(self.run, step, y.numpy(), self.rng)))
        if is_nan_step(self.run, step):
            self.nan = task.poison_hook(pl_module)
        if is_freeze_step(self.run, step):
            task.freeze_all_but_head(pl_module)

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.nan is not None:
            self.nan.remove()
            self.nan = None
        if self.monitor.step_done(trainer.global_step - 1, float(outputs["loss"])):
            trainer.should_stop = True


def train(run: ShapeRun, run_dir: Path, monitor: task.Monitor) -> dict[str, object]:
    """Train `run` into `run_dir`; return where the logger put what (for the label)."""
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")
    L.seed_everything(run.seed, verbose=False)
    shape = run.spec
    data = task.clusters(run.seed, run.train_size)
    net = deep.model_of(run.model, run.width)
    module = Classifier(net, run.lr, run.weight_decay, shape.grad_norms)
    if run.trap == "slow_finetune":
        task.pretrain(module.net, data, run.seed)
    gen = torch.Generator().manual_seed(run.seed)
    train_set = torch.utils.data.TensorDataset(torch.from_numpy(data.x), torch.from_numpy(data.y))
    val_set = torch.utils.data.TensorDataset(
        torch.from_numpy(data.val_x), torch.from_numpy(data.val_y)
    )
    loaders = (
        torch.utils.data.DataLoader(train_set, batch_size=run.batch, shuffle=True, generator=gen),
        torch.utils.data.DataLoader(val_set, batch_size=256),
    )
    cls = TensorBoardLogger if shape.logger == "tb" else CSVLogger
    extra: dict[str, Any] = {}
    if shape.log_every != 50:  # 50 is the Trainer's default; leave it unset there
        extra["log_every_n_steps"] = shape.log_every
    trainer = L.Trainer(
        max_steps=run.steps,
        logger=cls(save_dir=str(run_dir)),
        # the monitor after the faults: it reads the lr they set for this batch
        callbacks=[
            Faults(run, monitor),
            *([LearningRateMonitor("step")] if shape.lr_monitor else []),
        ],
        val_check_interval=shape.eval_every,
        check_val_every_n_epoch=None,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        **extra,
    )
    trainer.fit(module, *loaders)
    sub = "lightning_logs/version_0"
    return {
        "framework_version": f"lightning {L.__version__}",
        "series": {
            "loss": [sub, "train_loss"],
            "val_loss": [sub, "val_loss"],
            "grad_norm": [sub, "grad_2.0_norm_total"] if shape.grad_norms else None,
            "lr": [sub, "lr-AdamW"] if shape.lr_monitor else None,
        },
        "epoch_axis": None,
    }
