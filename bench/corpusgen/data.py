"""Training data for the corpus: small, deterministic, and built offline.

The benchmark must run without downloads, so the "real text" is what ships on
every machine: docstrings of the Python standard library and the license
texts under /usr/share/common-licenses. The vision-like and tabular tasks are
synthetic but non-trivial (a random teacher network, noisy shape images), so
loss curves have the shape of real training: fast early progress, a noisy
tail, and room to overfit.
"""

from __future__ import annotations

import ast
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

# Stdlib modules with long English docstrings; any subset that exists is enough.
_DOC_MODULES = (
    "argparse",
    "collections/__init__",
    "functools",
    "inspect",
    "json/__init__",
    "logging/__init__",
    "pathlib",
    "subprocess",
    "threading",
    "typing",
    "unittest/case",
    "dataclasses",
    "enum",
    "heapq",
    "textwrap",
    "difflib",
    "email/message",
    "http/client",
    "asyncio/tasks",
    "statistics",
)
_LICENSES = Path("/usr/share/common-licenses")


@dataclass
class Split:
    """Inputs and targets of one split; `x` is float features or int tokens."""

    x: Tensor
    y: Tensor


@dataclass
class Dataset:
    """A train and a validation split, plus what the loss and the faults need."""

    name: str
    train: Split
    val: Split
    classes: int  # number of classes, or the vocabulary size for language models
    is_text: bool


def stdlib_docstrings() -> str:
    """English prose from stdlib docstrings: real text that needs no download."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    for module in _DOC_MODULES:
        path = lib / f"{module}.py"
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc:
                    parts.append(doc)
    return "\n\n".join(parts)


def license_texts() -> str:
    """License texts shipped by Debian-like systems; stdlib prose if absent."""
    texts = [p.read_text(errors="replace") for p in sorted(_LICENSES.glob("*")) if p.is_file()]
    joined = "\n\n".join(texts)
    return joined if len(joined) > 50_000 else stdlib_docstrings()


def char_lm(text: str, seq: int, seed: int, train_windows: int = 6000) -> Dataset:
    """Character-level language modelling windows over `text` (90/10 split by position).

    Windows are cut at random offsets once, with the run's seed, so the epoch
    structure is fixed and a rerun sees the same batches.
    """
    alphabet = sorted({c for c in text if c.isprintable() or c == "\n"})
    index = {c: i for i, c in enumerate(alphabet)}
    ids = torch.tensor([index[c] for c in text if c in index], dtype=torch.long)
    cut = int(len(ids) * 0.9)
    gen = torch.Generator().manual_seed(seed)

    def windows(part: Tensor, count: int) -> Split:
        starts = torch.randint(0, len(part) - seq - 1, (count,), generator=gen)
        chunks = torch.stack([part[s : s + seq + 1] for s in starts.tolist()])
        return Split(chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous())

    return Dataset(
        "text", windows(ids[:cut], train_windows), windows(ids[cut:], 128), len(alphabet), True
    )


def teacher_classification(seed: int, train_size: int = 8000, dim: int = 32) -> Dataset:
    """Labels from a random two-layer teacher with 10% label noise: learnable, never perfect."""
    gen = torch.Generator().manual_seed(1000 + seed)
    w1 = torch.randn(dim, 64, generator=gen) / dim**0.5
    w2 = torch.randn(64, 10, generator=gen) / 8

    def draw(n: int) -> Split:
        x = torch.randn(n, dim, generator=gen)
        y = (torch.relu(x @ w1) @ w2).argmax(dim=1)
        flip = torch.rand(n, generator=gen) < 0.1
        y[flip] = torch.randint(0, 10, (int(flip.sum()),), generator=gen)
        return Split(x, y)

    return Dataset("teacher", draw(train_size), draw(2000), 10, False)


def teacher_regression(seed: int, train_size: int = 8000, dim: int = 32) -> Dataset:
    """A smooth target from a random teacher plus noise, standardised: tabular regression."""
    gen = torch.Generator().manual_seed(3000 + seed)
    w1 = torch.randn(dim, 64, generator=gen) / dim**0.5
    w2 = torch.randn(64, 1, generator=gen) / 8

    def draw(n: int) -> Split:
        x = torch.randn(n, dim, generator=gen)
        y = torch.tanh(x @ w1) @ w2
        y = y / 0.35 + 0.3 * torch.randn(n, 1, generator=gen)
        return Split(x, y)

    return Dataset("teacher_reg", draw(train_size), draw(2000), 1, False)


def shapes(seed: int, train_size: int = 4000, size: int = 16) -> Dataset:
    """Noisy 16x16 images of four shapes at random places: a CNN-shaped task."""
    gen = torch.Generator().manual_seed(2000 + seed)

    def draw(n: int) -> Split:
        x = torch.randn(n, 1, size, size, generator=gen) * 0.6
        y = torch.randint(0, 4, (n,), generator=gen)
        r = torch.randint(2, size - 6, (n, 2), generator=gen)
        for i in range(n):
            a, b = r[i].tolist()
            kind = int(y[i])
            if kind == 0:
                x[i, 0, a, b : b + 5] += 1.5
            elif kind == 1:
                x[i, 0, a : a + 5, b] += 1.5
            elif kind == 2:
                for k in range(5):
                    x[i, 0, a + k, b + k] += 1.5
            else:
                x[i, 0, a : a + 4, b : b + 4] += 0.8
        return Split(x, y)

    return Dataset("shapes", draw(train_size), draw(800), 4, False)


def load(task: str, seed: int, train_size: int | None = None) -> Dataset:
    """The dataset a model trains on; `train_size` shrinks it (the overfitting fault)."""
    if task == "teacher":
        return teacher_classification(seed, train_size or 8000)
    if task == "teacher_reg":
        return teacher_regression(seed, train_size or 8000)
    if task == "shapes":
        return shapes(seed, train_size or 4000)
    if task == "docs":
        return char_lm(stdlib_docstrings(), 64, seed, train_size or 6000)
    if task == "licenses":
        return char_lm(license_texts(), 32, seed, train_size or 6000)
    raise ValueError(f"unknown task {task!r}")
