"""The small model and data the probe's tests train, and how they read its file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 16)
        self.squash = nn.Tanh()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.squash(self.fc2(self.act(self.fc1(x)))))


def batches(n: int, seed: int = 0, size: int = 32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(size, 8, generator=g), torch.randint(0, 4, (size,), generator=g))
        for _ in range(n)
    ]


def read(logdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A single process's probe file in `logdir`, as `read_file` reads it."""
    return read_file(logdir / "trainsentry-probe.jsonl")


def read_file(path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A probe file's meta record and its step records (the end record left out)."""
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return records[0], [r for r in records[1:] if r.get("kind") != "end"]


def layer_norm(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.double().norm()) ** 2 for t in tensors))
