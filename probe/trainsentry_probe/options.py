"""What the probe measures and how often: one frozen dataclass, checked once.

Statistics come in cost tiers because their costs differ by orders of
magnitude: the total gradient norm is one fused kernel over tensors that are
already there, per-layer norms and update ratios need a copy of the weights
before the step, activation statistics need forward hooks and a pass over
every activation. Cadences are in optimizer steps; a cadence of 0 turns a
tier off. The defaults keep the probe under ~1% of step time (see
bench/probe_overhead.py) while still giving rules a point every 100 steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ProbeOptions:
    """Options of `watch()`; every field can be passed as a keyword to it."""

    # tier 1: loss, lr, total gradient norm, step time, data wait, forward time,
    # non-finite count
    every: int = 1
    # tier 2: per-layer gradient/parameter norms, update ratios, concentration, GPU memory
    layer_every: int = 100
    # tier 3: activations, attention entropy, embedding norms, per-sample loss spread
    sample_every: int = 1000
    # device→host: steps kept on the device before one batched transfer (None: 20),
    # and the longest a record may wait
    transfer_every: int | None = None
    transfer_seconds: float = 10.0
    # the copy of the weights before a layer step that update ratios need (memory: one model)
    update_ratio: bool = True
    # elements per tensor above which update ratios are estimated on a fixed sample
    # (gradients.snapshot); 0 copies every weight whole
    update_sample: int = 65536
    activations: bool = True
    # background NVML sampling of GPU utilisation and memory, seconds between samples (0: off)
    gpu_sample_seconds: float = 5.0
    # stop file: where it is looked for (stopfile.py: stop_file, $TRAINSENTRY_STOP_FILE,
    # <control_dir>/STOP, <logdir>/.trainsentry/STOP) and how often
    stop_file: str | None = None
    control_dir: str | None = None
    stop_every: int = 50
    raise_on_stop: bool = False
    # distributed: every rank writes a file of its own; by default ranks > 0 record
    # only their per-step timing and loss, all_ranks=True makes them record everything
    all_ranks: bool = False
    # identity and the run's trace, written in the meta record
    run_id: str | None = None
    seed: int | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    # AMP: the torch.amp.GradScaler in use, so norms taken at the end of backward
    # (before the scaler unscales) are divided by its scale
    grad_scaler: Any = None
    # the step number the first optimizer step gets (a resumed run passes its global step)
    start_step: int = 0

    def __post_init__(self) -> None:
        for name in ("every", "layer_every", "sample_every", "stop_every"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
        if self.transfer_every is not None and self.transfer_every < 1:
            raise ValueError(f"transfer_every must be at least 1, got {self.transfer_every!r}")
        if self.transfer_seconds <= 0:
            raise ValueError(f"transfer_seconds must be positive, got {self.transfer_seconds!r}")
        if self.gpu_sample_seconds < 0:
            raise ValueError("gpu_sample_seconds must be >= 0")

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> ProbeOptions:
        """Options from `watch(**kwargs)`, naming a close match for a misspelt one."""
        known = {f.name for f in fields(cls)}
        for key in kwargs:
            if key not in known:
                import difflib

                close = difflib.get_close_matches(key, sorted(known), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise TypeError(f"unknown probe option {key!r}{hint}")
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        """The options for the meta record (hparams are written separately)."""
        skip = ("hparams", "grad_scaler")
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        out["grad_scaler"] = self.grad_scaler is not None
        return out


def due(step: int, cadence: int) -> bool:
    """Whether a tier with this cadence records at `step` (0 disables the tier)."""
    return cadence > 0 and step % cadence == 0
