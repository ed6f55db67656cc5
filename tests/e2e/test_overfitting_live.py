"""Severe overfitting paged by the live daemon on a real torch loop, a healthy tiny-batch run quiet.

A small-data run (64 samples, 30 % of labels flipped, an MLP that memorises
them) logs its training loss every 10 steps and its validation loss every 50,
as a plain loop with a SummaryWriter does: its training loss falls under 0.1
while validation leaves its best for good. The pack must page (critical, the
family `overfitting`) by the second evaluation on which validation is over 5×
the training loss and 40 % above its best (overfitting_gap's comment), and
never page a tiny-batch run (batch 2) on plenty of data, whose single-batch
training losses (clean labels) sit near zero, validation over 5× them and
noisy about its best. One daemon reads both runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import live_alerts

torch = pytest.importorskip("torch")
tensorboard = pytest.importorskip("torch.utils.tensorboard")

LOG_EVERY = 10
EVAL_EVERY = 50
STEPS = 300


def labelled(n: int, seed: int, noise: float) -> tuple[Any, Any]:
    """The first feature's sign, a share of labels flipped: noise a big model memorises."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=gen)
    y = (x[:, 0] > 0).long()
    flip = torch.rand(n, generator=gen) < noise
    y[flip] = 1 - y[flip]
    return x, y


def train(run_dir: Path, samples: int, batch: int, noise: float) -> list[tuple[int, float, float]]:
    """Train and log; (step, training loss logged last, validation loss) per evaluation."""
    torch.manual_seed(0)
    x, y = labelled(samples, 1, noise)
    val_x, val_y = labelled(500, 2, noise)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 2),
    )  # fmt: skip
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    gen = torch.Generator().manual_seed(0)
    writer = tensorboard.SummaryWriter(str(run_dir))
    evaluations, logged = [], float("nan")
    for step in range(1, STEPS + 1):
        idx = torch.randint(0, samples, (batch,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % LOG_EVERY == 0:
            logged = loss.item()
            writer.add_scalar("Loss/train", logged, step)
        if step % EVAL_EVERY == 0:
            with torch.no_grad():
                val = torch.nn.functional.cross_entropy(model(val_x), val_y).item()
            writer.add_scalar("Loss/val", val, step)
            evaluations.append((step, logged, val))
    writer.close()
    return evaluations


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("overfitting")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread, no oversubscription
    try:
        memorising = train(root / "memorising", samples=64, batch=16, noise=0.3)
        tiny_batch = train(root / "tiny_batch", samples=4000, batch=2, noise=0.0)
    finally:
        torch.set_num_threads(threads)
    state = tmp_path_factory.mktemp("state")
    alerts = live_alerts(state / "alerts.jsonl", str(root), "--state-dir", str(state / "s"))
    return {"alerts": alerts, "memorising": memorising, "tiny_batch": tiny_batch}


def pages(alerts: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    return [
        a for a in alerts
        if a["run"] == run and a["state"] == "firing" and a["severity"] == "critical"
    ]  # fmt: skip


def test_a_memorising_run_pages_by_the_second_evaluation_of_the_gap(
    scenario: dict[str, Any],
) -> None:
    evaluations = scenario["memorising"]
    best, holding = float("inf"), []
    for step, train_loss, val in evaluations:
        # the seed's gap and a validation well off its best, on the loop's own numbers
        if train_loss < 0.1 and val > 5 * train_loss and val > 1.5 * best:
            holding.append(step)
        best = min(best, val)
    assert len(holding) >= 2, evaluations  # the fault is there to be seen
    paged = pages(scenario["alerts"], "memorising")
    assert paged, scenario["alerts"]
    assert {a["rule"] for a in paged} <= {"overfitting_gap", "overfitting_severe"}, paged
    assert min(a["step"] for a in paged) <= holding[1], (paged, evaluations)


def test_a_tiny_batch_run_on_plenty_of_data_is_never_paged(scenario: dict[str, Any]) -> None:
    # the seed's gap alone holds on it: training under 0.1, validation over 5x
    gap = [(t, v) for _, t, v in scenario["tiny_batch"] if t < 0.1 and v > 5 * t]
    assert gap, scenario["tiny_batch"]
    assert pages(scenario["alerts"], "tiny_batch") == [], scenario["alerts"]
