"""Logging against environment frames, with one host sync per logging call."""

from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch

__all__ = ["log_metrics"]


def log_metrics(
    trainer: L.Trainer, metrics: Mapping[str, float | torch.Tensor], frames: int
) -> dict[str, float]:
    """Sends ``metrics`` to every logger with ``step=frames`` and exposes them as callback metrics.

    Tensors are stacked and read back in one transfer, so logging costs a single synchronization no matter
    how many metrics there are. ``trainer.callback_metrics`` is updated so that ``ModelCheckpoint`` can
    monitor the values and the progress bar can show them.

    Returns:
        The metrics as floats.
    """
    names = list(metrics)
    tensors = [metrics[k] for k in names]
    if any(isinstance(v, torch.Tensor) for v in tensors):
        stacked = torch.stack([torch.as_tensor(v, dtype=torch.float32).reshape(()).cpu() for v in tensors])
        values = stacked.tolist()
    else:
        values = [float(v) for v in tensors]
    out = dict(zip(names, values))
    for logger in trainer.loggers:
        logger.log_metrics(out, step=frames)
    for k, v in out.items():
        trainer.callback_metrics[k] = torch.tensor(v)
    return out
