"""Rows of statistics kept on the device, and the one batched copy to the host.

Reading a device value (`.item()`, `.tolist()`, `float(t)`) makes the host wait
until the device has finished all queued work: the loop loses its lead over
the GPU. So a step's statistics stay on the device as a `Row`; every
`transfer_every` steps (or `transfer_seconds`, whichever first) the rows'
tensors are concatenated (one kernel) and copied at once. On CUDA the copy is
asynchronous into pinned memory and followed by an event on the device's
current stream: the writer thread waits on the event, the training loop never
does. Once it has completed, so has everything queued before it on that
stream, the steps' `forward_time` events among them (clock.py).

The trade-off is latency: with transfer_every=20 at 0.5 s/step the daemon sees
a step up to ~10 s late (bounded by transfer_seconds), against one copy per
20 steps. Alerts are about trends over tens of steps, so this costs nothing
that matters. On the CPU the copy itself is free, but handing each step to the
writer thread is not (~50 µs a step, measured in bench/probe_overhead.py: the
concatenation, the queue, the writer waking for the GIL), so rows are batched
there too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Row:
    """One step's statistics: host values, and named device tensors not yet read."""

    step: int
    time: float = 0.0
    host: dict[str, Any] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)
    chunks: list[torch.Tensor] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)  # chunk lengths, set when sent
    loss: torch.Tensor | float | None = None  # running sum (gradient accumulation)
    loss_count: int = 0
    explicit_loss: bool = False

    def put(self, name: str, tensor: torch.Tensor) -> None:
        self.names.append(name)
        if tensor.requires_grad or tensor.dtype != torch.float32 or tensor.dim() != 1:
            tensor = tensor.detach().reshape(-1).float()
        self.chunks.append(tensor)  # the per-step norms are already so: three ops saved

    def replace(self, name: str, tensor: torch.Tensor) -> None:
        """Puts a chunk, dropping an earlier one of that name (a later backward of an
        accumulating step supersedes the earlier one)."""
        self.remove(name)
        self.put(name, tensor)

    def remove(self, name: str) -> None:
        """Drops the chunks of that name, if any."""
        while name in self.names:
            at = self.names.index(name)
            del self.names[at], self.chunks[at]

    def add_loss(self, value: torch.Tensor | float, explicit: bool) -> None:
        """Accumulates a micro-batch's loss; an explicitly given loss wins over one
        captured from the model's output."""
        if explicit and not self.explicit_loss:
            self.loss, self.loss_count, self.explicit_loss = None, 0, True
        elif self.explicit_loss and not explicit:
            return
        self.loss = value if self.loss is None else self.loss + value
        self.loss_count += 1

    def seal(self) -> None:
        """Turns the accumulated loss into its mean, as a host value or a device chunk."""
        if self.loss is None:
            return
        mean = self.loss / self.loss_count
        if isinstance(mean, torch.Tensor):
            self.put("loss", mean)
        else:
            self.host["loss"] = mean
        self.loss = None

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.host


@dataclass
class Batch:
    """Rows on their way to the writer, with their values in flight."""

    rows: list[Row]
    flat: torch.Tensor | None
    event: Any = None  # torch.cuda.Event when the copy is asynchronous

    def values(self) -> list[dict[str, list[float]]]:
        """Per row, name → values. Blocks (the writer thread) until the copy is done."""
        if self.event is not None:
            self.event.synchronize()
        flat = self.flat.tolist() if self.flat is not None else []
        out: list[dict[str, list[float]]] = []
        at = 0
        for row in self.rows:
            named: dict[str, list[float]] = {}
            for name, size in zip(row.names, row.sizes, strict=True):
                named[name] = flat[at : at + size]
                at += size
            out.append(named)
        return out


class Transfer:
    """Collects sealed rows and sends them to the host in batches."""

    def __init__(self, device: torch.device, every: int, seconds: float) -> None:
        self.device = device
        self.every = every
        self.seconds = seconds
        self.rows: list[Row] = []
        self._last = time.monotonic()

    def add(self, row: Row) -> Batch | None:
        """Queues a row; a batch when it is time to send."""
        row.seal()
        if row.empty:
            return None
        self.rows.append(row)
        if len(self.rows) >= self.every or time.monotonic() - self._last >= self.seconds:
            return self.send()
        return None

    def send(self) -> Batch | None:
        self._last = time.monotonic()
        rows, self.rows = self.rows, []
        if not rows:
            return None
        chunks: list[torch.Tensor] = []
        for row in rows:
            row.sizes = [c.numel() for c in row.chunks]
            chunks.extend(c.to(self.device) for c in row.chunks)
            row.chunks = []
        if not chunks:
            # rows that carry forward_time's CUDA events and no device value: the writer
            # waits on a marker queued after them instead of a copy's (clock.py)
            timed = self.device.type == "cuda" and any("forward_events" in r.host for r in rows)
            return Batch(rows, None, self._marker() if timed else None)
        flat = torch.cat(chunks)
        if flat.is_cuda:
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            return Batch(rows, host, self._marker())
        return Batch(rows, flat.cpu())

    def _marker(self) -> Any:
        """An event on the device's current stream, complete once all queued before it is."""
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event
