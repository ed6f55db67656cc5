"""Deep networks for the vanishing-gradients fault and the healthy traps beside it.

A deep stack of saturating layers without normalisation (16 Linear-sigmoid
layers) passes its first layers 1e-14 of the gradient its head gets, from the
first step, while its total norm looks healthy: the fault. The same stack
with a BatchNorm after each Linear keeps every weight over 4.8e-3 of the
largest (its Linear biases, ahead of the BatchNorm, get 1e-9), and a small
pre-LN transformer over 1e-2: the traps. Measured on the clusters task
(task.py) with torch's default initialisation. Each has a `head`, as Body
has, so the shapes' faults that act on it still apply.
"""

from __future__ import annotations

import torch
from torch import nn

from corpusgen.shapes import task

DEPTH = 16
TOKENS = 8  # the 32 input features read as 8 tokens of 4


class DeepStack(nn.Module):
    """`DEPTH` Linear layers of `width`, each followed by BatchNorm (if `norm`) and a sigmoid."""

    def __init__(self, width: int, norm: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        size = task.DIM
        for _ in range(DEPTH):
            layers.append(nn.Linear(size, width))
            if norm:
                layers.append(nn.BatchNorm1d(width))
            layers.append(nn.Sigmoid())
            size = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, task.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class PreLNTransformer(nn.Module):
    """Two pre-LN encoder layers (residuals around LayerNorm-ed blocks) over 8 tokens."""

    def __init__(self, width: int) -> None:
        super().__init__()
        d = 32
        self.embed = nn.Linear(task.DIM // TOKENS, d)
        self.pos = nn.Parameter(torch.zeros(TOKENS, d))
        block = nn.TransformerEncoderLayer(
            d, 4, width, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(block, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, task.CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.view(len(x), TOKENS, -1)) + self.pos
        return self.head(self.norm(self.encoder(h)).mean(1))


def model_of(model: str, width: int) -> nn.Module:
    """The network a run trains: the shared Body, or one of the deep ones by name."""
    if model == "deep_sigmoid":
        return DeepStack(width, norm=False)
    if model == "deep_bn_sigmoid":
        return DeepStack(width, norm=True)
    if model == "preln_transformer":
        return PreLNTransformer(width)
    return task.Body(width)
