"""GPU utilization, memory, temperature and power from NVML."""

from __future__ import annotations

import contextlib
import importlib
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from callbacks._logging import log_metrics, notice_once


class GPUMonitor(Callback):
    """Log NVML readings of the training GPU on a wall-clock interval, without touching the CUDA stream.

    NVML (``pynvml`` from the optional ``nvidia-ml-py`` package, ``pip install rl_lightning[gpu]``) reads the
    driver's counters; no CUDA call, so no synchronization. ``setup`` opens the device that the run uses,
    matched by UUID (so ``CUDA_VISIBLE_DEVICES`` and MIG are honoured; by index when the UUID lookup fails).
    ``on_train_batch_end`` checks ``time.perf_counter()`` and samples when ``interval_s`` has passed since
    the last sample. A reading the device does not support (power on some boards) is dropped after its first
    failure. Without a CUDA device or without ``pynvml`` this is a no-op with a one-time notice.

    Metrics (logged against environment frames when the data module exposes ``frames``):
        ``gpu/utilization``: percent of the last sample period a kernel was running.
        ``gpu/memory_used_mb``, ``gpu/memory_total_mb``: device memory in MiB (all processes, not only
        PyTorch's allocator).
        ``gpu/temperature_c``: core temperature in degrees Celsius.
        ``gpu/power_w``: board power draw in watts.

    The latest readings are also kept in ``latest`` (a dict with the keys above), e.g. for a progress bar.

    State: ``samples`` taken so far.

    Args:
        interval_s: seconds of wall time between samples (> 0).

    Example:
        >>> trainer = pl.Trainer(callbacks=[GPUMonitor(interval_s=5.0)], accelerator="gpu")
    """

    def __init__(self, interval_s: float = 5.0) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, int | float) or not interval_s > 0:
            raise ValueError(f"GPUMonitor: interval_s={interval_s!r} must be a positive number of seconds.")
        self.interval_s = float(interval_s)
        self.samples = 0
        self.latest: dict[str, float] = {}
        self._nvml: Any = None
        self._handle: Any = None
        self._unsupported: set[str] = set()
        self._last = float("-inf")

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self._handle is not None:
            return
        device = trainer.strategy.root_device
        if device.type != "cuda":
            notice_once(self, "GPUMonitor: no CUDA device; no gpu/* metrics.")
            return
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            notice_once(self, "GPUMonitor: pynvml is missing (pip install nvidia-ml-py); no gpu/* metrics.")
            return
        try:
            nvml.nvmlInit()
            self._handle = _open_device(nvml, device)
        except Exception as err:  # NVML raises its own error types (driver missing, no permission)
            notice_once(self, f"GPUMonitor: NVML unavailable ({err}); no gpu/* metrics.")
            return
        self._nvml = nvml

    def attach(self, nvml: Any, handle: Any) -> None:
        """Use an already opened NVML module and device handle (for tests and custom setups)."""
        self._nvml, self._handle = nvml, handle

    def sample(self) -> dict[str, float]:
        """Read the device now; returns the metrics (empty when NVML is not open)."""
        if self._handle is None:
            return {}
        nvml, handle = self._nvml, self._handle
        readers = {
            "gpu/utilization": lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu),
            "gpu/memory_used_mb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
            "gpu/memory_total_mb": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total / 2**20,
            "gpu/temperature_c": lambda: float(
                nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            ),
            "gpu/power_w": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        }
        metrics = {}
        for key, read in readers.items():
            if key in self._unsupported:
                continue
            try:
                metrics[key] = float(read())
            except Exception:  # NVMLError_NotSupported and friends: drop this reading for the run
                self._unsupported.add(key)
        self.samples += 1
        self.latest = metrics
        return metrics

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._handle is None:
            return
        now = time.perf_counter()
        if now - self._last < self.interval_s:
            return
        self._last = now
        log_metrics(trainer, self.sample())

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self._nvml is None:
            return
        # Shutting down twice or after a driver reset fails harmlessly: nothing is left to release.
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()
        self._nvml = self._handle = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"samples": self.samples}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.samples = int(state_dict.get("samples", 0))


def _open_device(nvml: Any, device: torch.device) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    # torch prints the bare UUID; NVML wants it prefixed, "GPU-" for a whole GPU, "MIG-" for a MIG slice.
    for candidate in (uuid, f"GPU-{uuid}", f"MIG-{uuid}"):
        try:
            return nvml.nvmlDeviceGetHandleByUUID(candidate)
        except Exception:  # NVMLError_NotFound / InvalidArgument: try the next spelling
            continue
    # Last resort: the CUDA index equals the NVML index when CUDA_VISIBLE_DEVICES does not reorder devices.
    return nvml.nvmlDeviceGetHandleByIndex(index)
