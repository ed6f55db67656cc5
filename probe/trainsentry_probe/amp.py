"""Mixed precision: unscaled gradient norms, and the steps a GradScaler skips.

A `torch.amp.GradScaler` multiplies the loss by its scale before backward, so
the gradients the probe sees when backward ends are scale × the true ones
(65536× by default). It unscales them only inside `scaler.unscale_` or
`scaler.step`, and when they hold an inf/NaN it skips `optimizer.step()`
altogether and halves the scale: an overflow it handled, not a sick model.

What the probe does with a scaler (passed as `watch(grad_scaler=...)`):

- norms taken while the gradients are still scaled are divided by the scale
  the backward used (still on the device: no synchronisation). "Still
  scaled" is the scaler's own bookkeeping: its per-optimizer stage is not
  UNSCALED yet. A fused optimizer (`fused=True`) unscales inside its step,
  so even at the step hook its gradients can be scaled;
- a skipped step is recognised without reading anything from the device:
  `update()` replaces the scaler's per-optimizer state dict with a new one,
  so when a new step begins, the optimizer never stepped and that dict is no
  longer the one seen when backward ended, the scaler skipped the step. A
  fused optimizer does step (it skips inside, told by `optimizer.found_inf`),
  so there the flag is read with the step's other statistics instead;
- a skipped step keeps its step number (as HF's and Lightning's global step
  do) and is marked `amp_skipped`; its overflowed gradient norms are left
  out of the record, so the non-finite rules page only on gradients the
  optimizer applied.

These lean on GradScaler's private attributes (`_scale`,
`_per_optimizer_states`), stable from torch 1.6 to 2.13; where they are
missing the probe falls back to treating gradients as unscaled and counts
no skips, rather than failing.
"""

from __future__ import annotations

from typing import Any

import torch


class ScalerWatch:
    """What the probe needs to know about one GradScaler (or none)."""

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler
        self._marked: object = None

    @property
    def active(self) -> bool:
        scaler = self.scaler
        return scaler is not None and bool(getattr(scaler, "is_enabled", lambda: False)())

    def _states(self) -> Any:
        return getattr(self.scaler, "_per_optimizer_states", None)

    def scale(self) -> torch.Tensor | None:
        """The scale the current backward used, on the device; None without a scaler."""
        if not self.active:
            return None
        scale = getattr(self.scaler, "_scale", None)
        return scale if isinstance(scale, torch.Tensor) else None

    def scaled(self, optimizer: Any) -> bool:
        """Whether `optimizer`'s gradients are still multiplied by the scale."""
        if not self.active:
            return False
        states = self._states()
        if optimizer is None or states is None:
            return True  # at the end of backward, before any unscale_
        state = states.get(id(optimizer))  # .get: indexing the defaultdict would add one
        stage = state.get("stage") if isinstance(state, dict) else None
        return getattr(stage, "name", "READY") == "READY"

    def mark(self) -> None:
        """Remembers the scaler's per-step state at the end of a backward."""
        if self.active:
            self._marked = self._states()

    def skipped(self) -> bool:
        """Whether `update()` ran since the last backward: called when a new step
        begins and the optimizer has not stepped since that backward."""
        if not self.active or self._marked is None:
            return False
        return self._states() is not self._marked

    def clear(self) -> None:
        self._marked = None


def found_inf(optimizer: Any) -> torch.Tensor | None:
    """A fused optimizer's skip flag during its step (GradScaler sets it, then deletes it)."""
    flag = getattr(optimizer, "found_inf", None)
    return flag if isinstance(flag, torch.Tensor) else None
