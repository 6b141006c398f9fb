"""Logging helpers shared by the callbacks: the x-axis (environment frames) and direct logger calls.

Callbacks log plain Python floats straight to ``trainer.loggers`` instead of ``pl_module.log``: the latter
turns every float into a tensor on the module's device, a blocking host-to-device copy on CUDA.
"""

from __future__ import annotations

import numbers

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only


def read_frames(trainer: pl.Trainer) -> int | None:
    """Environment frames collected so far: the data module's progress view's ``frames`` (an int,
    ``trainer.datamodule.progress.frames``), else ``None``.

    A data module that counts frames (an RL data path) publishes them in its progress view, the one place
    callbacks read them; without one the callbacks fall back to Lightning's step count.
    """
    progress = getattr(getattr(trainer, "datamodule", None), "progress", None)
    value = getattr(progress, "frames", None)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


@rank_zero_only
def log_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    """Log ``metrics`` to every logger against environment frames (else the global step)."""
    if not metrics or not trainer.loggers:
        return
    frames = read_frames(trainer)
    step = frames if frames is not None else trainer.global_step
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)


def notice_once(owner: object, message: str) -> None:
    """Rank-zero info ``message`` the first time ``owner`` gives it (``setup`` runs once per stage)."""
    seen = owner.__dict__.setdefault("_notices_given", set())
    if message not in seen:
        seen.add(message)
        rank_zero_info(message)
