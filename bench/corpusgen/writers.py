"""Real metric writers, each with the names one ecosystem uses.

The rule engine only sees what these writers put on disk, so the corpus uses
the writers themselves (torch's SummaryWriter, tensorboardX, Lightning's
loggers) rather than hand-made files: their buffering, file layout and quirks
(Lightning's sparse CSV rows, Keras' per-split sub-directories and running
epoch means) are part of what a detector must cope with.

Names per writer (what the alias table has to map):

- hf_tb: train/loss, train/grad_norm, train/learning_rate, train/step_time;
  eval/loss
- lightning_csv, lightning_tb: train_loss, grad_2.0_norm_total, lr-<Optimizer>,
  step_time, epoch; val_loss
- tbx_tutorial: Loss/train, Gradient/Norm, LearningRate, Time/step; Loss/val
- jsonl_plain: loss, grad_norm, grad_norm/<module> per layer, lr, step_time;
  val_loss
- keras_tb: train/batch_loss (the epoch's mean so far), train/batch_grad_norm,
  train/batch_learning_rate, train/batch_step_time, train/epoch_loss,
  train/epoch_learning_rate; validation/epoch_loss

Keras' `epoch_*` series are on the epoch axis (step = epoch index), as Keras
writes them; label.json records `steps_per_epoch` so a benchmark can map an
alert on them back to training steps.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

WRITERS = ("hf_tb", "lightning_csv", "tbx_tutorial", "jsonl_plain", "keras_tb", "lightning_tb")


@dataclass
class TrainRecord:
    """What one training step reports."""

    step: int
    wall_time: float
    loss: float
    grad_norm: float
    lr: float
    step_time: float
    layer_norms: dict[str, float] = field(default_factory=dict)


class MetricWriter(Protocol):
    def train(self, rec: TrainRecord) -> None: ...

    def val(self, step: int, wall_time: float, val_loss: float) -> None: ...

    def close(self) -> None: ...


class HFTensorBoard:
    """torch's SummaryWriter with the HF Trainer's tag names."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=str(run_dir))

    def train(self, rec: TrainRecord) -> None:
        for tag, value in (
            ("train/loss", rec.loss),
            ("train/grad_norm", rec.grad_norm),
            ("train/learning_rate", rec.lr),
            ("train/step_time", rec.step_time),
        ):
            self._w.add_scalar(tag, value, rec.step, walltime=rec.wall_time)

    def val(self, step: int, wall_time: float, val_loss: float) -> None:
        self._w.add_scalar("eval/loss", val_loss, step, walltime=wall_time)

    def close(self) -> None:
        self._w.close()


class LightningLogger:
    """Lightning's own CSVLogger or TensorBoardLogger, fed as its Trainer would.

    The names are Lightning's: `grad_2.0_norm_total` is what
    `lightning.pytorch.utilities.grad_norm` returns, `lr-Adam` what
    LearningRateMonitor logs. The CSV logger is saved every 100 steps, the
    Trainer's default `log_every_n_steps` flush cadence.
    """

    def __init__(self, run_dir: Path, optimizer: str, kind: str, steps_per_epoch: int) -> None:
        from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

        cls = CSVLogger if kind == "csv" else TensorBoardLogger
        self._log = cls(save_dir=str(run_dir), name="", version="")
        self._lr_name = f"lr-{optimizer}"
        self.steps_per_epoch = steps_per_epoch

    def train(self, rec: TrainRecord) -> None:
        epoch = rec.step // self.steps_per_epoch
        self._log.log_metrics(
            {
                "train_loss": rec.loss,
                "grad_2.0_norm_total": rec.grad_norm,
                self._lr_name: rec.lr,
                "step_time": rec.step_time,
                "epoch": epoch,
            },
            step=rec.step,
        )
        if rec.step % 100 == 99:
            self._log.save()

    def val(self, step: int, wall_time: float, val_loss: float) -> None:
        self._log.log_metrics({"val_loss": val_loss, "epoch": step // self.steps_per_epoch}, step)

    def close(self) -> None:
        self._log.finalize("success")


class TbxTutorial:
    """tensorboardX with the names of the PyTorch TensorBoard tutorial."""

    def __init__(self, run_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self._w = SummaryWriter(logdir=str(run_dir))

    def train(self, rec: TrainRecord) -> None:
        for tag, value in (
            ("Loss/train", rec.loss),
            ("Gradient/Norm", rec.grad_norm),
            ("LearningRate", rec.lr),
            ("Time/step", rec.step_time),
        ):
            self._w.add_scalar(tag, value, rec.step, walltime=rec.wall_time)

    def val(self, step: int, wall_time: float, val_loss: float) -> None:
        self._w.add_scalar("Loss/val", val_loss, step, walltime=wall_time)

    def close(self) -> None:
        self._w.close()


class JsonlPlain:
    """A hand-rolled JSONL logger with plain names and per-layer grad norms."""

    def __init__(self, run_dir: Path) -> None:
        self._f = (run_dir / "metrics.jsonl").open("w", encoding="utf-8")

    def _write(self, record: dict[str, object]) -> None:
        self._f.write(json.dumps(record) + "\n")

    def train(self, rec: TrainRecord) -> None:
        record: dict[str, object] = {
            "step": rec.step,
            "time": rec.wall_time,
            "loss": rec.loss,
            "grad_norm": rec.grad_norm,
            "lr": rec.lr,
            "step_time": rec.step_time,
        }
        record.update({f"grad_norm/{name}": v for name, v in rec.layer_norms.items()})
        self._write(record)

    def val(self, step: int, wall_time: float, val_loss: float) -> None:
        self._write({"step": step, "time": wall_time, "val_loss": val_loss})

    def close(self) -> None:
        self._f.close()


class KerasTensorBoard:
    """What Keras' TensorBoard callback (update_freq="batch") writes, via torch's writer.

    Keras reports, per batch, the mean of the loss since the epoch began (its
    Mean metric is reset each epoch), so a one-batch spike is diluted; epoch
    summaries are on the epoch axis. Keras itself cannot be used here: its
    callback needs TensorFlow's summary ops.
    """

    def __init__(self, run_dir: Path, steps_per_epoch: int) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._train = SummaryWriter(log_dir=str(run_dir / "train"))
        self._valid = SummaryWriter(log_dir=str(run_dir / "validation"))
        self.steps_per_epoch = steps_per_epoch
        self._sum = 0.0
        self._count = 0

    def train(self, rec: TrainRecord) -> None:
        self._sum += rec.loss
        self._count += 1
        mean = self._sum / self._count
        w, step, t = self._train, rec.step, rec.wall_time
        w.add_scalar("batch_loss", mean, step, walltime=t)
        w.add_scalar("batch_grad_norm", rec.grad_norm, step, walltime=t)
        w.add_scalar("batch_learning_rate", rec.lr, step, walltime=t)
        w.add_scalar("batch_step_time", rec.step_time, step, walltime=t)
        if (step + 1) % self.steps_per_epoch == 0:
            epoch = step // self.steps_per_epoch
            w.add_scalar("epoch_loss", mean, epoch, walltime=t)
            w.add_scalar("epoch_learning_rate", rec.lr, epoch, walltime=t)
            self._sum, self._count = 0.0, 0

    def val(self, step: int, wall_time: float, val_loss: float) -> None:
        epoch = step // self.steps_per_epoch
        self._valid.add_scalar("epoch_loss", val_loss, epoch, walltime=wall_time)

    def close(self) -> None:
        self._train.close()
        self._valid.close()


def open_writer(kind: str, run_dir: Path, optimizer: str, steps_per_epoch: int) -> MetricWriter:
    """The writer named `kind`, writing into `run_dir`; an "epoch" is `steps_per_epoch` steps."""
    if kind == "hf_tb":
        return HFTensorBoard(run_dir)
    if kind == "lightning_csv":
        return LightningLogger(run_dir, optimizer, "csv", steps_per_epoch)
    if kind == "lightning_tb":
        return LightningLogger(run_dir, optimizer, "tb", steps_per_epoch)
    if kind == "tbx_tutorial":
        return TbxTutorial(run_dir)
    if kind == "jsonl_plain":
        return JsonlPlain(run_dir)
    if kind == "keras_tb":
        return KerasTensorBoard(run_dir, steps_per_epoch)
    raise ValueError(f"unknown writer {kind!r}")


# Writers that take the (simulated) wall time; the others stamp real time.
TAKES_WALLTIME = frozenset({"hf_tb", "tbx_tutorial", "jsonl_plain", "keras_tb"})
