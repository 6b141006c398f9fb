"""Logging helpers shared by the callbacks: the x-axis (environment frames) and direct logger calls.

Callbacks log plain Python floats straight to ``trainer.loggers`` instead of ``pl_module.log``: the latter
turns every float into a tensor on the module's device, a blocking host-to-device copy on CUDA.
"""

from __future__ import annotations

import numbers

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only


def read_frames(trainer: pl.Trainer, pl_module: pl.LightningModule | None = None) -> int | None:
    """Environment frames collected so far, from a duck-typed ``frames`` attribute, else ``None``.

    Looks at ``trainer.datamodule.frames`` first, then ``pl_module.frames``. Accepts an int or a CPU tensor;
    a CUDA tensor is ignored, since reading it would synchronize the device.
    """
    for owner in (getattr(trainer, "datamodule", None), pl_module):
        value = getattr(owner, "frames", None) if owner is not None else None
        if isinstance(value, bool):
            continue
        if isinstance(value, numbers.Integral):
            return int(value)
        if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.numel() == 1:
            return int(value)
    return None


@rank_zero_only
def log_metrics(
    trainer: pl.Trainer, metrics: dict[str, float], pl_module: pl.LightningModule | None = None
) -> None:
    """Log ``metrics`` to every logger against environment frames (else the global step)."""
    if not metrics or not trainer.loggers:
        return
    frames = read_frames(trainer, pl_module)
    step = frames if frames is not None else trainer.global_step
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def notice_once(owner: object, message: str) -> None:
    """Rank-zero info ``message`` the first time ``owner`` gives it (``setup`` runs once per stage)."""
    seen = owner.__dict__.setdefault("_notices_given", set())
    if message not in seen:
        seen.add(message)
        rank_zero_info(message)
