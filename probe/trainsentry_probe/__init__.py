"""trainsentry_probe: the statistics ordinary logs lack, computed inside the job.

Ordinary logs carry a loss and maybe one gradient norm; the failures that
matter start deeper (one layer's gradients exploding, ReLUs dying, updates
collapsing, a few samples carrying the loss). The probe measures these on the
device, cheaply, and writes them as JSON Lines where the trainsentry daemon
reads them. One line in a plain loop::

    probe = trainsentry_probe.watch(model, optimizer, logdir)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        probe.record(loss=loss)          # optional when the model returns its loss
        if probe.should_stop():          # the daemon's stop action
            save_checkpoint(); break
    probe.close()

Adapters: `trainsentry_probe.lightning.TrainsentryCallback` and
`trainsentry_probe.hf.TrainsentryCallback` (imported only when used: this
package never imports lightning, transformers, nor the daemon). The record
format is versioned and described in FORMAT.md.

Loops without the probe check the daemon's stop file with `StopFile`, which
needs no torch: torch is imported when `watch`, `Probe` or the record format
constants are first used, so a job of another framework can import this
package without torch installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainsentry_probe.options import ProbeOptions
from trainsentry_probe.stopfile import StopFile, StopRequest, TrainingStopped

if TYPE_CHECKING:
    from torch import nn

    from trainsentry_probe.probe import Probe
    from trainsentry_probe.records import RECORD_FORMAT, RECORD_FORMAT_VERSION

__all__ = [
    "RECORD_FORMAT",
    "RECORD_FORMAT_VERSION",
    "Probe",
    "ProbeOptions",
    "StopFile",
    "StopRequest",
    "TrainingStopped",
    "watch",
]

_NEEDS_TORCH = {
    "Probe": "trainsentry_probe.probe",
    "RECORD_FORMAT": "trainsentry_probe.records",
    "RECORD_FORMAT_VERSION": "trainsentry_probe.records",
}


def __getattr__(name: str) -> Any:
    if name in _NEEDS_TORCH:
        import importlib

        return getattr(importlib.import_module(_NEEDS_TORCH[name]), name)
    raise AttributeError(f"module 'trainsentry_probe' has no attribute {name!r}")


def watch(model: nn.Module, optimizer: Any, logdir: str | Path, **options: Any) -> Probe:
    """Starts probing `model` trained by `optimizer`, writing under `logdir`.

    Options (see ProbeOptions): every=1, layer_every=100, sample_every=1000,
    transfer_every, transfer_seconds=10, update_ratio=True, activations=True,
    gpu_sample_seconds=5, control_dir, stop_every=50, raise_on_stop=False,
    all_ranks=False, run_id, seed, hparams, start_step=0. `optimizer` may be
    None for loops without a torch optimizer: `probe.record(step, ...)` then
    marks each step's end.

    A single process writes `<logdir>/trainsentry-probe.jsonl`; in a
    distributed job every rank calls `watch` and writes
    `trainsentry-probe.rank<R>.jsonl`: rank 0 everything, the others their
    step timing and loss only (everything with `all_ranks=True`).
    """
    from trainsentry_probe.probe import Probe

    return Probe(model, optimizer, logdir, ProbeOptions.from_kwargs(options))
