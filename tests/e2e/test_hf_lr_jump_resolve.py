"""An lr ×100 under HF Trainer's linear decay: `lr_jump` is not "recovered" while the lr stays up.

A resumed scheduler (or a unit slip) multiplies the learning rate by 100 at
step 300; the Trainer's linear schedule then decays it. By step 550 it is
under the jump's line (×10 the highest it had) but still ×17 its value
before the jump: that is no recovery. `lr_jump` must stay firing until the lr
is back under the highest it had before the jump, in `replay` and in the live
daemon alike.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import live_alerts, replayed_alerts

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it
torch = pytest.importorskip("torch")

from support.toy_task import separable  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

EVERY = 10  # logging_steps
JUMP_AT = 300
STEPS = 600


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
        )

    def forward(self, x: Any, labels: Any) -> dict[str, Any]:
        logits = self.mlp(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Jump(transformers.TrainerCallback):  # type: ignore[misc]
    """The fault: the schedule's base lr ×100, as a resume that multiplied it leaves it."""

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == JUMP_AT:
            scheduler = kw["lr_scheduler"]
            scheduler.base_lrs = [lr * 100 for lr in scheduler.base_lrs]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    x, y = separable(512)
    data = [{"x": a, "labels": b} for a, b in zip(x, y, strict=True)]
    args = transformers.TrainingArguments(
        output_dir=str(root),
        report_to=["tensorboard"],
        logging_steps=EVERY,
        max_steps=STEPS,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    transformers.Trainer(model=Net(), args=args, train_dataset=data, callbacks=[Jump()]).train()
    return root / "runs"


def logged_lr(runs: Path) -> dict[int, float]:
    (path,) = glob.glob(str(runs / "**" / "events.out.tfevents.*"), recursive=True)
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars("train/learning_rate")}


def check_held_while_up(runs: Path, alerts: list[dict[str, Any]]) -> None:
    lr = logged_lr(runs)
    highest = max(v for s, v in lr.items() if s <= JUMP_AT)
    # the premise, on the real writer: decayed under the jump's line while still ×17 up
    assert highest < lr[550] < 10 * highest and lr[550] > 15 * lr[JUMP_AT], lr

    jump = [a for a in alerts if a["rule"] == "lr_jump"]
    assert [(a["state"], a["step"]) for a in jump][:1] == [("firing", JUMP_AT + EVERY)], jump
    for a in jump[1:]:
        # held while the lr stays up; "recovered" once back under the highest it had
        assert (a["state"], a["reason"]) == ("resolved", "recovered"), jump
        assert lr[a["step"]] <= highest, (a["step"], lr[a["step"]], highest)


def test_replay_holds_lr_jump_while_the_lr_stays_up(runs: Path) -> None:
    check_held_while_up(runs, replayed_alerts(str(runs)))


def test_the_live_daemon_holds_lr_jump_while_the_lr_stays_up(runs: Path, tmp_path: Path) -> None:
    alerts = live_alerts(tmp_path / "alerts.jsonl", str(runs), "--state-dir", str(tmp_path / "s"))
    check_held_while_up(runs, alerts)
