"""Real training jobs that save checkpoints, for the checkpoint tests.

`hf_train` fits a tiny model with the HF Trainer in the test's own process (a
config-built linear layer on the toy task), saving every few steps, and may
stop saving after a step while it goes on (a save callback gone quiet) or
resume from its last checkpoint. Run as a script, `python checkpoint_jobs.py
DIR KILL_AT` fits a Lightning module with ModelCheckpoint every 10 steps and
kills itself with SIGKILL at step KILL_AT, as the OOM killer would: nothing
more is written, its TensorBoard events flushed each step (as a job that
flushes promptly: docs/sources.md).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

SUPPORT = Path(__file__).resolve().parent
if str(SUPPORT.parent) not in sys.path:  # run as a script: support is a package of tests/
    sys.path.insert(0, str(SUPPORT.parent))

from support.toy_task import separable, separable_loader  # noqa: E402

LIGHTNING_EVERY = 10  # ModelCheckpoint(every_n_train_steps=...)


def hf_train(
    output_dir: Path,
    *,
    max_steps: int,
    save_every: int,
    stop_saving_after: int | None = None,
    pace: float = 0.0,
    resume: bool = False,
) -> None:
    """The HF Trainer on the toy task: TensorBoard logs in `output_dir/runs/<date>/`,
    `checkpoint-<N>/` every `save_every` steps (none after `stop_saving_after`), each
    step taking at least `pace` seconds."""
    import transformers

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            logits = self.lin(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    class Schedule(transformers.TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if pace:
                time.sleep(pace)
            if stop_saving_after is not None and state.global_step > stop_saving_after:
                control.should_save = False

    x, y = separable(256)
    data = [{"x": a, "labels": b} for a, b in zip(x, y, strict=True)]
    args = transformers.TrainingArguments(
        output_dir=str(output_dir),
        report_to=["tensorboard"],
        logging_steps=1,
        max_steps=max_steps,
        save_strategy="steps",
        save_steps=save_every,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    trainer = transformers.Trainer(
        model=Net(), args=args, train_dataset=data, callbacks=[Schedule()]
    )
    trainer.train(resume_from_checkpoint=True if resume else None)


def lightning_killed(logdir: Path, kill_at: int) -> None:
    """Lightning with ModelCheckpoint every LIGHTNING_EVERY steps, SIGKILLed at `kill_at`."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(8, 2)

        def training_step(self, batch: Any, _i: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.cross_entropy(self.lin(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), 0.05)

    class Killed(L.Callback):
        def on_train_batch_end(self, trainer: Any, *_: Any) -> None:
            trainer.logger.experiment.flush()
            time.sleep(0.02)
            if trainer.global_step >= kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    logger = TensorBoardLogger(save_dir=str(logdir), name="", version="")
    trainer = L.Trainer(
        max_steps=10 * kill_at,
        logger=logger,
        log_every_n_steps=1,
        callbacks=[
            ModelCheckpoint(every_n_train_steps=LIGHTNING_EVERY, save_top_k=-1),
            Killed(),
        ],
        accelerator="cpu",
        devices=1,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(), separable_loader(4096))


if __name__ == "__main__":
    lightning_killed(Path(sys.argv[1]), int(sys.argv[2]))
