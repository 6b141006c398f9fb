"""TensorFloat-32 matmuls and convolutions for the duration of a run."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from callbacks._logging import notice_once


class TF32(Callback):
    """Allow TF32 tensor cores for float32 matmuls (cuBLAS) and convolutions (cuDNN) during a run.

    ``setup`` records the current flags and enables TF32; ``on_fit_end``, ``teardown`` and
    ``on_exception`` put the recorded values back, so the process is left as it was found.

    Which API: torch 2.9+ has two sets of switches (``allow_tf32``/``set_float32_matmul_precision`` and
    ``fp32_precision``), and reading one after the other was written raises. This callback uses
    ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (which inductor and
    Lightning read through ``get_float32_matmul_precision``; it then reports ``"high"``), and only when the
    process already uses ``fp32_precision`` does it switch that one instead. ``set_float32_matmul_precision``
    is avoided on purpose: it also lowers the precision of CPU (oneDNN) matmuls.

    On CPU this is a no-op with a one-time notice (TF32 is a CUDA feature).

    Metrics: none. State: none (flags are process settings, not run state).

    Args:
        matmul: allow TF32 in cuBLAS matmuls.
        cudnn: allow TF32 in cuDNN convolutions and RNNs.

    Example:
        >>> trainer = pl.Trainer(callbacks=[TF32(matmul=True, cudnn=True)], accelerator="gpu")
    """

    def __init__(self, matmul: bool = True, cudnn: bool = True) -> None:
        if not isinstance(matmul, bool) or not isinstance(cudnn, bool):
            raise ValueError(f"TF32: matmul={matmul!r} and cudnn={cudnn!r} must be True or False.")
        if not (matmul or cudnn):
            raise ValueError(
                "TF32(matmul=False, cudnn=False) does nothing: enable one or remove the callback."
            )
        self.matmul = matmul
        self.cudnn = cudnn
        self._saved: dict[str, Any] | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.strategy.root_device.type != "cuda":
            notice_once(self, "TF32: no CUDA device; float32 precision flags left unchanged.")
            return
        self.apply_flags()

    def apply_flags(self) -> None:
        """Record the current flags and enable TF32 (idempotent until ``restore_flags``)."""
        if self._saved is not None:
            return
        backends = torch.backends
        try:
            saved: dict[str, Any] = {
                "api": "legacy",
                "matmul": backends.cuda.matmul.allow_tf32,
                "cudnn": backends.cudnn.allow_tf32,
            }
        except RuntimeError:
            # The process already set the fp32_precision API: the legacy getters refuse to read it.
            saved = {
                "api": "fp32_precision",
                "matmul": backends.cuda.matmul.fp32_precision,
                "conv": backends.cudnn.conv.fp32_precision,
                "rnn": backends.cudnn.rnn.fp32_precision,
            }
        self._saved = saved
        if saved["api"] == "legacy":
            if self.matmul:
                backends.cuda.matmul.allow_tf32 = True
            if self.cudnn:
                backends.cudnn.allow_tf32 = True
        else:
            if self.matmul:
                backends.cuda.matmul.fp32_precision = "tf32"
            if self.cudnn:
                backends.cudnn.conv.fp32_precision = "tf32"
                backends.cudnn.rnn.fp32_precision = "tf32"

    def restore_flags(self) -> None:
        """Put back the flags recorded by ``apply_flags`` (no-op when nothing was applied)."""
        saved, self._saved = self._saved, None
        if saved is None:
            return
        backends = torch.backends
        if saved["api"] == "legacy":
            backends.cuda.matmul.allow_tf32 = saved["matmul"]
            backends.cudnn.allow_tf32 = saved["cudnn"]
        else:
            backends.cuda.matmul.fp32_precision = saved["matmul"]
            backends.cudnn.conv.fp32_precision = saved["conv"]
            backends.cudnn.rnn.fp32_precision = saved["rnn"]

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.restore_flags()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.restore_flags()

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.restore_flags()
