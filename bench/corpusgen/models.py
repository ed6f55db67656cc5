"""The five model families of the corpus, each small enough to train in seconds.

They differ where it matters to a detector: a ReLU MLP and a CNN (dead units,
lr sensitivity), a deep sigmoid net (vanishing gradients), a tiny transformer
with LayerNorm (bounded activations, spiky Adam dynamics) and an LSTM
(exploding gradients through time).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

MODELS = ("mlp", "cnn", "transformer", "sigmoid", "lstm", "rnn")

# The task each model trains on (see data.load).
TASK_OF = {
    "mlp": "teacher",
    "sigmoid": "teacher",
    "cnn": "shapes",
    "transformer": "docs",
    "lstm": "licenses",
    "rnn": "licenses",
}


class MLP(nn.Module):
    def __init__(self, dim: int, classes: int, width: int = 128, depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        last = dim
        for _ in range(depth):
            layers += [nn.Linear(last, width), nn.ReLU()]
            last = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(last, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


class SigmoidNet(nn.Module):
    """A plain stack of sigmoid layers: deep enough, its first layers stop learning."""

    def __init__(self, dim: int, classes: int, depth: int, width: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        last = dim
        for _ in range(depth):
            layers += [nn.Linear(last, width), nn.Sigmoid()]
            last = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(last, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


class CNN(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.body(x))


class TinyTransformer(nn.Module):
    """A two-layer causal character LM, pre-LayerNorm like GPT-2."""

    def __init__(self, vocab: int, seq: int = 64, width: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(seq, width) * 0.02)
        layer = nn.TransformerEncoderLayer(
            width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq))

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        h = self.embed(x) + self.pos[:t]
        h = self.body(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


class CharRNN(nn.Module):
    """A character LM on an LSTM or a plain tanh RNN (the one whose gradients explode)."""

    def __init__(self, vocab: int, cell: str, width: int = 96) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, 32)
        kind = nn.LSTM if cell == "lstm" else nn.RNN
        self.body = kind(32, width, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, x: Tensor) -> Tensor:
        h, _ = self.body(self.embed(x))
        return self.head(h)


def build(
    model: str, classes: int, *, depth: int | None = None, width: int | None = None
) -> nn.Module:
    """A fresh model; `depth`/`width` override the family's default (vanishing, overfitting)."""
    if model == "mlp":
        return MLP(32, classes, width=width or 128)
    if model == "sigmoid":
        return SigmoidNet(32, classes, depth=depth or 4)
    if model == "cnn":
        return CNN(classes)
    if model == "transformer":
        return TinyTransformer(classes)
    if model in ("lstm", "rnn"):
        return CharRNN(classes, model)
    raise ValueError(f"unknown model {model!r}")
