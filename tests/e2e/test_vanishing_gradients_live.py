"""Vanishing gradients of a real deep sigmoid stack warned live; healthy deep networks quiet.

A plain torch loop logs each parameter's gradient norm as `grad_norm/<param>`
every 10 steps with a SummaryWriter (the total norm beside it looks healthy).
A 16-deep Linear-sigmoid stack without normalisation passes its first layers
~1e-14 of its head's gradient from the first step: `layer_gradients_vanishing`
must warn on them by the third logged point (its comment). The same stack with
a BatchNorm after each Linear (whose Linear biases get ~1e-9 of the largest)
and a small pre-LN transformer must raise nothing of it. One daemon reads the
three runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.daemon_process import live_alerts

torch = pytest.importorskip("torch")
tensorboard = pytest.importorskip("torch.utils.tensorboard")
nn = torch.nn

RULE = "layer_gradients_vanishing"
LOG_EVERY = 10
STEPS = 60
DEPTH = 16


def stack(norm: bool) -> Any:
    layers: list[Any] = []
    for i in range(DEPTH):
        layers.append(nn.Linear(16 if i == 0 else 32, 32))
        if norm:
            layers.append(nn.BatchNorm1d(32))
        layers.append(nn.Sigmoid())
    return nn.Sequential(*layers, nn.Linear(32, 2))


class PreLN(nn.Module):  # type: ignore[misc]
    """Two pre-LN encoder layers over the 16 features read as 4 tokens of 4."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 32)
        block = nn.TransformerEncoderLayer(
            32, 4, 64, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
        self.head = nn.Linear(32, 2)

    def forward(self, x: Any) -> Any:
        return self.head(self.encoder(self.embed(x.view(len(x), 4, 4))).mean(1))


def train(run_dir: Path, model: Any) -> None:
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(512, 16, generator=gen)
    y = (x[:, 0] > 0).long()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    writer = tensorboard.SummaryWriter(str(run_dir))
    for step in range(STEPS):
        idx = torch.randint(0, len(x), (32,), generator=gen)
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        if step % LOG_EVERY == 0:
            norms = {n: p.grad.norm().item() for n, p in model.named_parameters()}
            writer.add_scalar("loss", loss.item(), step)
            writer.add_scalar("grad_norm", sum(v * v for v in norms.values()) ** 0.5, step)
            for name, norm in norms.items():
                writer.add_scalar(f"grad_norm/{name}", norm, step)
        opt.step()
    writer.close()


@pytest.fixture(scope="module")
def alerts(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("deep")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread, no oversubscription
    try:
        # each model made from a known seed, whatever the tests before drew
        for name, make in (
            ("sigmoid_stack", lambda: stack(norm=False)),
            ("batchnorm_stack", lambda: stack(norm=True)),
            ("preln_transformer", PreLN),
        ):
            torch.manual_seed(0)
            train(root / name, make())
    finally:
        torch.set_num_threads(threads)
    state = tmp_path_factory.mktemp("state")
    return live_alerts(state / "alerts.jsonl", str(root), "--state-dir", str(state / "s"))


def vanishing(alerts: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    return [a for a in alerts if a["run"] == run and a["rule"] == RULE and a["state"] == "firing"]


def test_the_sigmoid_stack_warns_on_its_first_layers_by_the_third_logged_point(
    alerts: list[dict[str, Any]],
) -> None:
    fired = vanishing(alerts, "sigmoid_stack")
    metrics = {a["metric"] for a in fired}
    assert "grad_norm/0.weight" in metrics, alerts  # the first layer
    assert not any(m.endswith(".bias") for m in metrics), metrics  # biases are not judged
    assert f"grad_norm/{2 * DEPTH}.weight" not in metrics, metrics  # the head is the largest
    assert all(a["severity"] == "warning" for a in fired), fired
    # the first layers are under the line from step 0: warned by the third logged point
    # (deeper ones may cross it later as the head learns)
    first = [a["step"] for a in fired if a["metric"] == "grad_norm/0.weight"]
    assert min(first) <= 2 * LOG_EVERY, fired


def test_deep_networks_with_normalisation_or_residuals_raise_nothing_of_it(
    alerts: list[dict[str, Any]],
) -> None:
    assert vanishing(alerts, "batchnorm_stack") == [], alerts
    assert vanishing(alerts, "preln_transformer") == [], alerts
