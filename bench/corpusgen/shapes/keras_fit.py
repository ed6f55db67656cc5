"""Keras runs: `model.fit` with the TensorBoard callback and a CSVLogger, as the docs show.

`TensorBoard(log_dir, update_freq=...)` writes, in logs/train/, `epoch_loss`
and `epoch_learning_rate` with step = epoch, and with an integer update_freq
also `batch_loss` (Keras' running mean since the epoch began) with step =
the global batch; in logs/validation/, `epoch_loss` with step = epoch and
`evaluation_loss_vs_iterations` with step = optimizer iterations. So one run
holds series on two step axes. The CSVLogger writes one row per epoch
(`epoch`, `loss`, `val_loss`) beside logs/. TensorFlow is not installed: the
callback writes through tf_summary's stand-in (same records as TF2).

Batches come from a PyDataset whose faults (label noise, a NaN sample) key
on the global step of the batch; Keras fetches one batch ahead, so a
callback tells the dataset the step of the next batch it will be asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "torch")

import keras
import numpy as np
from keras.src.callbacks import tensorboard as keras_tensorboard

from corpusgen.shapes import task
from corpusgen.shapes.spec import (
    ShapeRun,
    is_freeze_step,
    is_nan_step,
    lr_factor,
)
from corpusgen.shapes.tf_summary import TfSummary, keras_model_summary


class Batches(keras.utils.PyDataset):
    """`steps_per_epoch` random batches per epoch, with the run's data faults."""

    def __init__(self, run: ShapeRun, data: task.Data, y: np.ndarray) -> None:
        super().__init__()
        self.run = run
        self.x, self.y = data.x, y
        self.next_step = 1
        self.rng = np.random.default_rng(8000 + run.seed)
        self.noise = np.random.default_rng(9000 + run.seed)

    def __len__(self) -> int:
        return self.run.spec.steps_per_epoch

    def __getitem__(self, _i: int) -> tuple[np.ndarray, np.ndarray]:
        step = self.next_step
        idx = self.rng.integers(0, len(self.x), self.run.batch)
        x, y = self.x[idx], task.noisy_labels(self.run, step, self.y[idx], self.noise)
        if is_nan_step(self.run, step):
            x = x.copy()
            x[0, 0] = np.nan
        return x, y


class Faults(keras.callbacks.Callback):
    """lr, freezing and the dataset's step; raw per-batch loss for the monitor."""

    def __init__(self, run: ShapeRun, monitor: task.Monitor, batches: Batches) -> None:
        super().__init__()
        self.run = run
        self.monitor = monitor
        self.batches = batches
        self.epoch = 0
        self.mean = 0.0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.epoch = epoch
        self.batches.next_step = epoch * self.run.spec.steps_per_epoch + 1

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        step = self.epoch * self.run.spec.steps_per_epoch + batch + 1
        self.batches.next_step = step + 1
        self.model.optimizer.learning_rate.assign(self.run.lr * lr_factor(self.run, step))
        if is_freeze_step(self.run, step):
            for layer in self.model.layers[:-1]:
                layer.trainable = False

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        step = self.epoch * self.run.spec.steps_per_epoch + batch + 1
        mean = float((logs or {}).get("loss", np.nan))
        raw = mean if batch == 0 else mean * (batch + 1) - self.mean * batch
        self.mean = mean
        if self.monitor.step_done(step, raw):
            self.model.stop_training = True


def _model(run: ShapeRun, lr: float) -> keras.Model:
    layers = [
        keras.layers.Dense(run.width, activation="relu"),
        keras.layers.Dense(run.width, activation="relu"),
        keras.layers.Dense(task.CLASSES),
    ]
    model = keras.Sequential([keras.Input((task.DIM,)), *layers])
    if run.weight_decay:
        opt: keras.optimizers.Optimizer = keras.optimizers.AdamW(lr, run.weight_decay)
    else:
        opt = keras.optimizers.Adam(lr)
    model.compile(opt, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _pretrained(run: ShapeRun, data: task.Data) -> keras.Model:
    """A fine-tune's start: trained on renamed labels, then a fresh head at a low lr."""
    base = _model(run, 1e-3)
    perm = np.random.default_rng(run.seed).permutation(task.CLASSES)
    base.fit(data.x, perm[data.y], batch_size=32, epochs=1, steps_per_epoch=400, verbose=0)
    model = _model(run, run.lr)
    for new, old in zip(model.layers[:-1], base.layers[:-1], strict=True):
        new.set_weights(old.get_weights())
    return model


def train(run: ShapeRun, run_dir: Path, monitor: task.Monitor) -> dict[str, object]:
    """Train `run` into `run_dir`; return where the callbacks put what (for the label)."""
    keras.utils.set_random_seed(run.seed)
    data = task.clusters(run.seed, run.train_size)
    model = _pretrained(run, data) if run.trap == "slow_finetune" else _model(run, run.lr)
    shape = run.spec
    board = keras.callbacks.TensorBoard(str(run_dir / "logs"), update_freq=shape.update_freq)
    summary = TfSummary()
    board._summary_module = summary
    keras_tensorboard.keras_model_summary = keras_model_summary(summary)
    batches = Batches(run, data, data.y)
    model.fit(
        batches,
        epochs=run.steps // shape.steps_per_epoch,
        validation_data=(data.val_x, data.val_y),
        verbose=0,
        callbacks=[
            Faults(run, monitor, batches),
            board,
            keras.callbacks.CSVLogger(str(run_dir / "training.csv")),
        ],
    )
    batch_series = shape.update_freq != "epoch"
    return {
        "framework_version": f"keras {keras.__version__} ({keras.backend.backend()})",
        "series": {
            "loss": ["logs", "train/batch_loss" if batch_series else "train/epoch_loss"],
            "val_loss": ["logs", "validation/epoch_loss"],
            "grad_norm": None,
            "lr": ["logs", "train/epoch_learning_rate"],
        },
        # Series whose step is the epoch: all of the CSV's, and TensorBoard's epoch_* tags.
        "epoch_axis": {"runs": [""], "tag_prefix": "epoch_"},
    }
