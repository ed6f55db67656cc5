"""Lightning's recipe for watching gradients, through a real Trainer, read by the real daemon.

The Lightning docs log per-parameter gradient norms with
`self.log_dict(grad_norm(self, norm_type=2))` in `on_before_optimizer_step`.
A parameter frozen mid-run has no gradient, so the hook no longer gives its
norm, and Lightning re-logs the last value it had at each logging step until
the epoch ends, bit for bit the same, then writes nothing. `layer_gradients_stopped`
must see that as the layer it is, and stay quiet on the run that freezes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import replayed_alerts

L = pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from lightning.pytorch.utilities import grad_norm  # noqa: E402
from support.toy_task import separable_loader  # noqa: E402

EVERY = 50  # Lightning's default log_every_n_steps, left unset below
FREEZE_AT = 500
STEPS = 900


class Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.head = torch.nn.Linear(16, 2)

    def training_step(self, batch: Any, _i: int) -> Any:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(self.body(x)), y)
        self.log("train_loss", loss)
        return loss

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.log_dict(grad_norm(self, norm_type=2))

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), 1e-3)


class FreezeBody(L.Callback):
    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, _i: int) -> None:
        if trainer.global_step == FREEZE_AT:
            for p in module.body.parameters():
                p.requires_grad_(False)


def fit(root: Path, freeze: bool) -> Path:
    loader = separable_loader(512)
    trainer = L.Trainer(
        max_steps=STEPS,
        logger=TensorBoardLogger(save_dir=str(root)),
        callbacks=[FreezeBody()] if freeze else [],
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Net(), loader)
    return root


def firings(logdir: Path) -> list[dict[str, Any]]:
    return [a for a in replayed_alerts(str(logdir)) if a["state"] == "firing"]


def test_a_frozen_body_warns_on_each_of_its_parameters_within_three_intervals(
    tmp_path: Path,
) -> None:
    fired = firings(fit(tmp_path / "frozen", freeze=True))
    stopped = [a for a in fired if a["rule"] == "layer_gradients_stopped"]
    assert sorted(a["metric"] for a in stopped) == [
        "grad_2.0_norm/body.0.bias",
        "grad_2.0_norm/body.0.weight",
    ], fired
    for alert in stopped:
        # its last new value at the last logged step before the freeze; fired once the
        # run is 3 intervals past it, at the next logged step. Lightning re-logs that
        # value until the epoch ends (32 batches here), then writes nothing: either way
        assert FREEZE_AT + 2 * EVERY <= int(alert["step"]) <= FREEZE_AT + 4 * EVERY, alert
        assert f"since step {FREEZE_AT - 1} " in alert["message"], alert["message"]


def test_the_same_run_without_a_freeze_raises_nothing(tmp_path: Path) -> None:
    fired = firings(fit(tmp_path / "healthy", freeze=False))
    assert fired == [], fired
