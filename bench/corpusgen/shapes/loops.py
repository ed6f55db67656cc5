"""Plain torch loops logging as the TF2 and tensorboardX guides show.

tb_tensor: the TF2 "custom training loop" guide, with tensorboard's own
writer in place of `tf.summary` (it writes the same tensor-encoded scalars
without TensorFlow): one writer in <run>/train and one in <run>/test, the
tag `loss` in both, the train value a Mean metric over the `log_every` steps
since the last write (the guide's `train_loss.result()` then
`reset_states()`). tbx_tutorial_every: tensorboardX's README, a
SummaryWriter in <run> with `Loss/train` every step and `Loss/test` at each
evaluation.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from corpusgen.shapes import task
from corpusgen.shapes.spec import ShapeRun, is_freeze_step, is_nan_step, lr_factor


class _TF2Writer:
    """`tf.summary.create_file_writer(dir)` and `tf.summary.scalar`, on tensorboard's writer."""

    def __init__(self, logdir: Path) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._w = EventFileWriter(str(logdir), filename_suffix=f".{os.getpid()}.0.v2")

    def scalar(self, name: str, value: float, step: int) -> None:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb

        summary = scalar_pb(name, value)
        self._w.add_event(event_pb2.Event(wall_time=time.time(), step=step, summary=summary))

    def close(self) -> None:
        self._w.close()


def _val_loss(model: nn.Module, data: task.Data) -> float:
    model.eval()
    with torch.no_grad():
        x, y = torch.from_numpy(data.val_x), torch.from_numpy(data.val_y)
        loss = float(nn.functional.cross_entropy(model(x), y))
    model.train()
    return loss


def train(run: ShapeRun, run_dir: Path, monitor: task.Monitor) -> dict[str, object]:
    """Train `run` into `run_dir` with the shape's writer; return where it put what."""
    torch.manual_seed(run.seed)
    data = task.clusters(run.seed, run.train_size)
    model = task.Body(run.width)
    if run.trap == "slow_finetune":
        task.pretrain(model, data, run.seed)
    opt = torch.optim.AdamW(model.parameters(), run.lr, weight_decay=run.weight_decay)
    shape = run.spec
    tf2 = shape.framework == "tb_tensor"
    if tf2:
        train_w, test_w = _TF2Writer(run_dir / "train"), _TF2Writer(run_dir / "test")
    else:
        from tensorboardX import SummaryWriter

        tbx = SummaryWriter(logdir=str(run_dir))
    x_all, y_all = torch.from_numpy(data.x), data.y
    gen = torch.Generator().manual_seed(5000 + run.seed)
    noise = np.random.default_rng(9000 + run.seed)
    window: list[float] = []
    try:
        for step in range(run.steps):
            for group in opt.param_groups:
                group["lr"] = run.lr * lr_factor(run, step)
            idx = torch.randint(0, len(x_all), (run.batch,), generator=gen)
            y = torch.from_numpy(task.noisy_labels(run, step, y_all[idx.numpy()], noise))
            if is_freeze_step(run, step):
                task.freeze_all_but_head(model)
            hook = task.poison_hook(model) if is_nan_step(run, step) else None
            loss = nn.functional.cross_entropy(model(x_all[idx]), y)
            if hook is not None:
                hook.remove()
            opt.zero_grad()
            loss.backward()
            opt.step()
            value = loss.item()
            if tf2:
                window.append(value)
                if (step + 1) % shape.log_every == 0:
                    train_w.scalar("loss", float(np.mean(window)), step)
                    window.clear()
            else:
                tbx.add_scalar("Loss/train", value, step)
            if (step + 1) % shape.eval_every == 0:
                val = _val_loss(model, data)
                if tf2:
                    test_w.scalar("loss", val, step)
                else:
                    tbx.add_scalar("Loss/test", val, step)
            if monitor.step_done(step, value):
                break
    finally:
        if tf2:
            train_w.close()
            test_w.close()
        else:
            tbx.close()
    if tf2:
        series = {"loss": ["", "train/loss"], "val_loss": ["", "test/loss"]}
        version = "tensorboard EventFileWriter (TF2 tensor scalars)"
    else:
        series = {"loss": ["", "Loss/train"], "val_loss": ["", "Loss/test"]}
        version = "tensorboardX SummaryWriter"
    return {
        "framework_version": version,
        "series": {**series, "grad_norm": None, "lr": None},
        "epoch_axis": None,
    }
