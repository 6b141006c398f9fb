"""Autocast around the module's hot paths, acting included."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from tensordict import TensorDictBase
from typing_extensions import override

from callbacks._protocol import (
    HotPathCallback,
    check_paths_argument,
    resolve_hot_paths,
    wrap_hot_path,
)
from callbacks.cuda_graphs import CudaGraphs

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# Trainer precisions each dtype cooperates with: Lightning's plugin autocasts ``training_step`` and, for
# fp16, owns the GradScaler.
_COMPATIBLE_PRECISION = {"bf16": ("32-true", "bf16-mixed"), "fp16": ("16-mixed",)}


class MixedPrecision(HotPathCallback):
    """Run the hot paths (``update``, ``act``) under ``torch.autocast`` in bf16 or fp16.

    Lightning's precision plugin (``Trainer(precision="bf16-mixed")``) autocasts ``training_step`` only;
    acting happens during collection, outside it. This callback wraps every selected hot path in
    ``torch.autocast(device_type, dtype)`` so the policy runs in low precision while collecting, and the
    update too (also when the Trainer's precision is left at ``"32-true"``). Floating outputs that come out
    in the autocast dtype are cast back to float32 (unless the input already held them in that dtype), so
    environments and replay-buffer storage keep the dtypes of their specs.

    Design for fp16: loss scaling stays with Lightning. ``dtype="fp16"`` requires
    ``Trainer(precision="16-mixed")``, whose plugin owns the ``GradScaler``: ``manual_backward`` scales the
    loss and ``optimizer.step()`` unscales, skips steps with inf/nan gradients and updates the scale, and the
    scaler's state is checkpointed with the trainer. This callback adds autocast around ``act``, so both
    precisions act as they train. Limits: fp16 needs CUDA (refused on CPU); fp16 cannot be combined with
    ``CudaGraphs`` (the scaler reads its inf check on the host every step); ``bf16`` cooperates with
    ``"32-true"`` and ``"bf16-mixed"`` only. Backward runs inside the autocast region, as Lightning's plugin
    does with manual optimization; autocast keeps backward ops in the dtypes of their forward ops. With
    ``CudaGraphs`` the autocast weight cache is disabled (cached casts must not outlive a captured region).

    Ordering: list it before ``TorchCompile`` so the autocast region is traced into the compiled graph.

    On CPU: bf16 autocast works; fp16 raises in ``setup``.

    Metrics: none. State: none (the GradScaler's state is checkpointed by Lightning's precision plugin).

    Args:
        dtype: ``"bf16"`` or ``"fp16"``.
        paths: hot paths to autocast; ``None`` means all of the module's ``hot_paths``.

    Example:
        >>> trainer = pl.Trainer(callbacks=[MixedPrecision("bf16")])
        >>> trainer = pl.Trainer(callbacks=[MixedPrecision("fp16")], precision="16-mixed", accelerator="gpu")
    """

    def __init__(self, dtype: str = "bf16", paths: Sequence[str] | None = None) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"MixedPrecision: dtype={dtype!r} is not supported; use 'bf16' or 'fp16'.")
        self.dtype = dtype
        self.paths = check_paths_argument(paths, "MixedPrecision")
        self._selected: tuple[str, ...] = ()
        self._device_type = "cpu"
        self._cache_enabled = True

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        device_type = trainer.strategy.root_device.type
        if self.dtype == "fp16" and device_type != "cuda":
            raise RuntimeError(
                f"MixedPrecision(dtype='fp16') needs a CUDA device (this run is on {device_type}): fp16 with "
                "a GradScaler is a GPU recipe. Use MixedPrecision(dtype='bf16') on CPU or remove it."
            )
        precision = str(trainer.precision)
        if precision not in _COMPATIBLE_PRECISION[self.dtype]:
            hint = (
                "pass Trainer(precision='16-mixed'): its plugin owns the GradScaler that fp16 needs"
                if self.dtype == "fp16"
                else "use Trainer(precision='32-true') or 'bf16-mixed' with it"
            )
            raise RuntimeError(
                f"MixedPrecision(dtype={self.dtype!r}) with Trainer(precision={precision!r}): {hint}."
            )
        if not torch.amp.is_autocast_available(device_type):
            raise RuntimeError(
                f"MixedPrecision: torch.autocast does not support device type {device_type!r}."
            )
        if self.dtype == "bf16" and device_type == "cuda" and not torch.cuda.is_bf16_supported():
            raise RuntimeError(
                "MixedPrecision(dtype='bf16'): this GPU has no bf16 support; use dtype='fp16'."
            )
        graphs = device_type == "cuda" and any(isinstance(cb, CudaGraphs) for cb in trainer.callbacks)
        if graphs and self.dtype == "fp16":
            raise RuntimeError(
                "MixedPrecision(dtype='fp16') cannot be combined with CudaGraphs: the GradScaler reads its "
                "inf check on the host every step. Use dtype='bf16' with CudaGraphs."
            )
        self._device_type = device_type
        self._cache_enabled = not graphs
        self._selected = resolve_hot_paths(pl_module, self.paths, "MixedPrecision")

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name in self._selected:
            wrap_hot_path(pl_module, name, self._autocast, owner=self)

    def _autocast(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        dtype, device_type, cache = DTYPES[self.dtype], self._device_type, self._cache_enabled

        @functools.wraps(fn)
        def run(td: Any, *args: Any, **kwargs: Any) -> Any:
            already_low = _low_precision_keys(td, dtype)
            with torch.autocast(device_type, dtype=dtype, cache_enabled=cache):
                out = fn(td, *args, **kwargs)
            return _upcast(out, dtype, already_low)

        return run


def _low_precision_keys(td: Any, dtype: torch.dtype) -> frozenset:
    if not isinstance(td, TensorDictBase):
        return frozenset()
    return frozenset(k for k, v in td.items(True, True) if isinstance(v, torch.Tensor) and v.dtype == dtype)


def _upcast(out: Any, dtype: torch.dtype, keep: frozenset) -> Any:
    if isinstance(out, torch.Tensor):
        return out.float() if out.dtype == dtype else out
    if isinstance(out, TensorDictBase):
        for key, value in list(out.items(True, True)):
            if isinstance(value, torch.Tensor) and value.dtype == dtype and key not in keep:
                out.set(key, value.float())
    return out
