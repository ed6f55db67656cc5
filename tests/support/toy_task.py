"""The toy task the real-trainer tests fit: 8 features, the class is the first one's sign.

Learnable in a few hundred steps of a linear layer, so a healthy run's loss falls
and settles, and a fault shows against it.
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, TensorDataset


def separable(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`n` samples and labels, the same every call (the generator is seeded here)."""
    torch.manual_seed(0)
    x = torch.randn(n, 8)
    return x, (x[:, 0] > 0).long()


def separable_loader(n: int, batch_size: int = 16) -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(TensorDataset(*separable(n)), batch_size=batch_size, shuffle=True)
