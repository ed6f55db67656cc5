"""An lr jump under Lightning's LearningRateMonitor, through a real Trainer and the real daemon.

LearningRateMonitor writes the learning rate at the start of a logging step's
batch, and the step's loss after it: judged on its own point, `lr_jump` saw
the loss of the record before and paged one logging interval late. The pair
must be judged with the loss of its own record, on the first record after
the jump.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import replayed_alerts

L = pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from lightning.pytorch.callbacks import LearningRateMonitor  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from support.toy_task import separable_loader  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import (  # noqa: E402
    EventFileLoader,
)

EVERY = 50  # Lightning's default log_every_n_steps, left unset below
JUMP_AT = 500  # the first update at the jumped learning rate
STEPS = 700


class Net(L.LightningModule):
    def __init__(self, jump: float) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 2)
        self.jump = jump

    def training_step(self, batch: Any, _i: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(self.body(x)), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), 1e-3)
        # a schedule (or a resume) that multiplies the lr: the fault an lr_jump is
        jump = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda step: self.jump if step >= JUMP_AT else 1.0
        )
        return {"optimizer": opt, "lr_scheduler": {"scheduler": jump, "interval": "step"}}


def fit(root: Path, jump: float) -> Path:
    loader = separable_loader(1024)
    L.Trainer(
        max_steps=STEPS,
        logger=TensorBoardLogger(save_dir=str(root)),
        callbacks=[LearningRateMonitor(logging_interval="step")],
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(Net(jump), loader)
    return root


def test_the_jump_pages_on_the_first_record_after_it(tmp_path: Path) -> None:
    root = fit(tmp_path / "jump", jump=1e4)
    first = JUMP_AT + EVERY - 1  # Lightning logs at steps 49, 99, ...: 549
    # the premise, on the real writer: the lr comes before its step's loss
    (path,) = glob.glob(str(root / "**" / "events.out.tfevents.*"), recursive=True)
    records = [e for e in EventFileLoader(path).Load() if e.step == first]
    order = [v.tag for e in records for v in e.summary.value]
    assert order.index("lr-AdamW") < order.index("train_loss"), order

    fired = [a for a in replayed_alerts(str(root)) if a["state"] == "firing"]
    pages = [a for a in fired if a["severity"] == "critical"]
    assert pages and (pages[0]["rule"], pages[0]["step"]) == ("lr_jump", first), fired
    assert "×1e+04 the highest it had before" in pages[0]["message"]


def test_the_same_run_without_the_jump_raises_nothing(tmp_path: Path) -> None:
    fired = [a for a in replayed_alerts(str(fit(tmp_path / "plain", jump=1.0)))]
    assert [a for a in fired if a["state"] == "firing"] == [], fired
