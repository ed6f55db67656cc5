"""PyTorch Lightning adapter: `Trainer(callbacks=[TrainsentryCallback()])`.

Imported only by users who ask for it; the core never imports lightning.
Lightning runs forward and backward inside `optimizer.step(closure)`, and
`training_step` rarely calls the module itself, so the callback hands the
loss to the probe before backward (gradient norms are then taken when
backward ends, before Lightning clips); the loss value comes from what
`training_step` returns, and a stop file sets
`trainer.should_stop`, so Lightning ends the fit at the end of the batch and
its checkpoint callbacks run as usual.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

try:
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.callbacks import Callback
except ImportError:  # the older package name
    from pytorch_lightning import LightningModule, Trainer  # type: ignore[assignment]
    from pytorch_lightning.callbacks import Callback  # type: ignore[assignment]

import torch

from trainsentry_probe import watch
from trainsentry_probe.probe import Probe


def _loss_in(outputs: Any) -> Any:
    if isinstance(outputs, dict):
        return outputs.get("loss")
    return outputs


class TrainsentryCallback(Callback):
    """Watches the LightningModule and its first optimizer during `fit`.

    `logdir` defaults to the trainer's log directory (where its loggers write,
    so the daemon finds the probe file beside the run's other logs);
    `sample_per_epoch` takes activation statistics at every epoch's first
    step; other keywords are `watch()` options.
    """

    def __init__(
        self, logdir: str | Path | None = None, sample_per_epoch: bool = False, **options: Any
    ) -> None:
        self.logdir = logdir
        self.sample_per_epoch = sample_per_epoch
        self.options = options
        self.probe: Probe | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        logdir = self.logdir or trainer.log_dir or trainer.default_root_dir
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        options = dict(self.options)
        options.setdefault("start_step", trainer.global_step)
        options.setdefault("grad_scaler", getattr(trainer, "scaler", None))  # "16-mixed"
        hparams = getattr(pl_module, "hparams", None)
        if hparams:
            options.setdefault("hparams", dict(hparams))
        self.probe = watch(pl_module, optimizer, logdir, **options)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.probe is not None and self.sample_per_epoch:
            self.probe.sample_next()

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.probe is not None:
            self.probe.begin_step()

    def on_before_backward(
        self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor
    ) -> None:
        if self.probe is not None:
            self.probe.before_backward(loss)

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.probe is None:
            return
        loss = _loss_in(outputs)
        if loss is not None:
            self.probe.record(loss=loss)
        if self.probe.should_stop():
            trainer.should_stop = True

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.probe is None or trainer.sanity_checking:
            return
        val_loss = trainer.callback_metrics.get("val_loss")
        if val_loss is not None:
            self.probe.record(val_loss=val_loss)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.probe is not None:
            self.probe.close()

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if self.probe is not None:
            self.probe.close(exception)
