"""HF Trainer's filtered NaN, written by a real Trainer and replayed by the real daemon.

`logging_nan_inf_filter` (on by default) keeps NaN/inf losses out of the mean
the Trainer logs, so once the weights are NaN every later record says
`loss 0.0` beside a NaN `grad_norm`. The first such record must page: the
norm alone waits 16 steps for GradScaler's search (the second record at
`logging_steps=10`), and the loss itself never shows a NaN.
"""

from __future__ import annotations

import glob
from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import replayed_alerts

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer needs it
torch = pytest.importorskip("torch")

from support.toy_task import separable  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

EVERY = 10  # logging_steps
POISON_AT = 40  # the update whose forward sees a NaN: its step is 41
STEPS = 80


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 2)
        self.poison = False

    def forward(self, x: Any, labels: Any) -> dict[str, Any]:
        if self.poison:  # one corrupt batch; the NaN update that follows poisons the weights
            x = x * float("nan")
            self.poison = False
        logits = self.lin(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Poison(transformers.TrainerCallback):  # type: ignore[misc]
    def __init__(self, net: Net, at: int | None) -> None:
        self.net, self.at = net, at

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == self.at:
            self.net.poison = True


def train(root: Path, poison_at: int | None) -> Path:
    x, y = separable(256)
    data = [{"x": a, "labels": b} for a, b in zip(x, y, strict=True)]
    net = Net()
    args = transformers.TrainingArguments(
        output_dir=str(root),  # the TensorBoard callback writes under its runs/
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
    transformers.Trainer(
        model=net, args=args, train_dataset=data, callbacks=[Poison(net, poison_at)]
    ).train()
    return root / "runs"


def logged(runs: Path, tag: str) -> dict[int, float]:
    (path,) = glob.glob(str(runs / "**" / "events.out.tfevents.*"), recursive=True)
    events = EventAccumulator(path, size_guidance={"scalars": 0})
    events.Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


def test_the_first_filtered_record_pages(tmp_path: Path) -> None:
    runs = train(tmp_path, poison_at=POISON_AT)
    first = POISON_AT + EVERY  # the first record whose interval is wholly NaN
    # what the Trainer wrote: the premise of the rule, checked on the real writer
    loss, norm = logged(runs, "train/loss"), logged(runs, "train/grad_norm")
    assert all(v > 0 for s, v in loss.items() if s < first) and loss[first] == 0.0, loss
    assert str(norm[first]) == "nan", norm

    pages = [t for t in replayed_alerts(str(runs)) if t["severity"] == "critical"]
    assert pages, "a run whose weights are NaN paged nothing"
    head = pages[0]
    assert (head["rule"], head["step"]) == ("loss_filtered_non_finite", first), pages
    assert "while loss of the same step is 0" in head["message"]


def test_a_healthy_trainer_run_is_quiet(tmp_path: Path) -> None:
    runs = train(tmp_path, poison_at=None)
    assert not [t for t in replayed_alerts(str(runs)) if t["rule"].endswith("non_finite")]
