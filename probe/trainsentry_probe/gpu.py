"""GPU memory from the CUDA allocator, and utilisation sampled through NVML.

Allocator statistics (`torch.cuda.memory_allocated` and friends) are host-side
counters: reading them does not synchronise, so they are taken on every
layer-statistics step. A steady climb of allocated memory across those steps
is the signature of a leak (a tensor kept in a list, a graph retained through
a logged loss) long before the out-of-memory error.

Utilisation is not visible to the process at all: NVML (nvidia-ml-py) samples
it on a background thread. A GPU under 60 % busy for minutes is a job waiting
on its input pipeline. Without NVML or without a GPU the sampler is a no-op.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger("trainsentry_probe")


def cuda_memory(device: torch.device) -> dict[str, float]:
    """Allocated, reserved and peak-allocated bytes on a CUDA device; {} elsewhere."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return {}
    return {
        "gpu_mem": float(torch.cuda.memory_allocated(device)),
        "gpu_mem_reserved": float(torch.cuda.memory_reserved(device)),
        "gpu_mem_peak": float(torch.cuda.max_memory_allocated(device)),
    }


def nvml_handle(nvml: Any, device: torch.device) -> Any:
    """The NVML handle of a torch device. NVML numbers GPUs physically, torch after
    CUDA_VISIBLE_DEVICES, so the device is found by UUID where torch reports one."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
    return nvml.nvmlDeviceGetHandleByIndex(index)


class NvmlSampler:
    """Samples utilisation (%) and used memory (bytes) every `seconds` on a thread."""

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        seconds: float,
        emit: Callable[[dict[str, float]], None],
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        self._seconds = seconds
        self._emit = emit
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="trainsentry-probe-nvml", daemon=True
        )

    @classmethod
    def start_for(
        cls, device: torch.device, seconds: float, emit: Callable[[dict[str, float]], None]
    ) -> NvmlSampler | None:
        """A running sampler for a CUDA device, or None where NVML or the GPU is absent."""
        if seconds <= 0 or device.type != "cuda" or not torch.cuda.is_available():
            return None
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            handle = nvml_handle(pynvml, device)
        except Exception as exc:  # no library, no driver, no permission: no sampling
            log.info("trainsentry probe: no GPU utilisation sampling: %s", exc)
            return None
        sampler = cls(pynvml, handle, seconds, emit)
        sampler.start()
        return sampler

    def start(self) -> None:
        self._thread.start()

    def sample(self) -> dict[str, float]:
        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        return {"gpu_util": float(util.gpu), "gpu_mem_used": float(memory.used)}

    def _run(self) -> None:
        while not self._stop.wait(self._seconds):
            try:
                self._emit(self.sample())
            except Exception as exc:
                log.warning("trainsentry probe: NVML sampling stopped: %s", exc)
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self._seconds + 1)
