"""A layer's gradient norm far above its normal until the NaN, through a real Lightning Trainer.

The Lightning docs' recipe logs every parameter's gradient norm
(`grad_norm(self, norm_type=2)` in `on_before_optimizer_step`). A layer whose
gradients blow up ×40, ease to ×6 (under the rule's ×10 line, far above the
band it left) and turn NaN three steps later has not recovered at any point:
`layer_grad_norm_far_above_baseline` must keep firing to the NaN, never
resolve "recovered" on the way, in `replay` and in the live daemon alike.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import live_alerts, replayed_alerts

L = pytest.importorskip("lightning")
torch = pytest.importorskip("torch")

from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from lightning.pytorch.utilities import grad_norm  # noqa: E402
from support.toy_task import separable_loader  # noqa: E402

BLOW_UP_AT = 40  # the body's gradients ×40: 5 steps skipped and 20 learned before it
EASE_AT = 42  # ×6 from here
NAN_AT = 45
STEPS = 50
RULE = "layer_grad_norm_far_above_baseline"
BODY = ["grad_2.0_norm/body.0.bias", "grad_2.0_norm/body.0.weight"]


def factor(step: int) -> float:
    if step < BLOW_UP_AT:
        return 1.0
    if step < EASE_AT:
        return 40.0
    return 6.0 if step < NAN_AT else math.nan


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
        # the fault: one layer's gradients blow up, ease, and turn NaN (the update takes them)
        for p in self.body.parameters():
            p.grad.mul_(factor(self.trainer.global_step))
        self.log_dict(grad_norm(self, norm_type=2))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), 1e-2)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lightning")
    L.Trainer(
        max_steps=STEPS,
        logger=TensorBoardLogger(save_dir=str(root)),
        log_every_n_steps=1,
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(Net(), separable_loader(512))
    return root


def check_held_to_the_nan(alerts: list[dict[str, Any]]) -> None:
    layer = [a for a in alerts if a["rule"] == RULE and a["metric"] in BODY]
    fired = [a for a in layer if a["state"] == "firing"]
    assert sorted(a["metric"] for a in fired) == BODY, alerts
    assert all(a["step"] == BLOW_UP_AT + 1 for a in fired), fired  # for: 2 points
    # ×6 from EASE_AT to the NaN: still firing, no "recovered" (nor any resolve) before it
    assert [a for a in layer if a["state"] == "resolved"] == [], layer
    nan = [a for a in alerts if a["rule"] == "layer_grad_norm_non_finite"]
    assert {a["step"] for a in nan if a["metric"] in BODY} == {NAN_AT}, nan


def test_replay_keeps_the_layer_firing_to_the_nan(logdir: Path) -> None:
    check_held_to_the_nan(replayed_alerts(str(logdir)))


def test_the_live_daemon_keeps_the_layer_firing_to_the_nan(logdir: Path, tmp_path: Path) -> None:
    alerts = live_alerts(tmp_path / "alerts.jsonl", str(logdir), "--state-dir", str(tmp_path / "s"))
    check_held_to_the_nan(alerts)
