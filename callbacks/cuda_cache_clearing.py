"""Periodic release of the CUDA caching allocator's unused blocks."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from callbacks._logging import notice_once


class CudaCacheClearing(Callback):
    """Call ``torch.cuda.empty_cache()`` every ``every_n_steps`` training batches.

    The caching allocator keeps freed blocks for reuse; long RL runs with varying allocation sizes
    (evaluation rollouts, planner buffers) fragment it until an allocation fails although enough memory is
    free in total. Releasing the unused cached blocks now and then bounds that. It is not free:
    ``empty_cache`` waits for pending frees and the next allocations go back to ``cudaMalloc``, so keep the
    interval long (thousands of steps). Memory held by captured CUDA graphs stays in their private pools.

    The step counter is this callback's own (training batches seen) and is checkpointed, so the schedule
    continues across a resume. On CPU this is a no-op with a one-time notice.

    Metrics: none. State: ``steps`` (training batches seen) and ``clears`` (times the cache was emptied).

    Args:
        every_n_steps: training batches between two clears (>= 1).

    Example:
        >>> trainer = pl.Trainer(callbacks=[CudaCacheClearing(every_n_steps=1000)], accelerator="gpu")
    """

    def __init__(self, every_n_steps: int = 1000) -> None:
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(
                f"CudaCacheClearing: every_n_steps={every_n_steps!r} must be an int >= 1 (training batches "
                "between two torch.cuda.empty_cache() calls)."
            )
        self.every_n_steps = every_n_steps
        self.steps = 0
        self.clears = 0
        self.enabled = False

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self.enabled = trainer.strategy.root_device.type == "cuda"
        if not self.enabled:
            notice_once(self, "CudaCacheClearing: no CUDA device; nothing to clear.")

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.steps += 1
        if self.enabled and self.steps % self.every_n_steps == 0:
            torch.cuda.empty_cache()
            self.clears += 1

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "clears": self.clears}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = int(state_dict.get("steps", 0))
        self.clears = int(state_dict.get("clears", 0))
