"""A rich progress bar counted in environment frames."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from typing_extensions import override

__all__ = ["FramesProgressBar"]


class FramesProgressBar(RichProgressBar):
    """Shows frames done / total, env frames per second and the recent episode return.

    Lightning's bar counts batches, which here are gradient updates of unknown number; this one reads
    the data module's frame counter instead (no device sync: the counter is a host integer).

    Args:
        refresh_every_s: minimum seconds between redraws (redrawing costs more than a CartPole step).
    """

    def __init__(self, refresh_every_s: float = 0.25, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.refresh_every_s = refresh_every_s
        self._last_draw = 0.0
        self._t0 = 0.0
        self._f0 = 0

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._t0 = time.perf_counter()
        self._f0 = trainer.datamodule.frames

    @override
    def _get_train_description(self, current_epoch: int) -> str:
        return "frames"

    @override
    def _initialize_train_progress_bar_id(self) -> None:
        self.train_progress_bar_id = self._add_task(self.trainer.datamodule.collect.total_frames, "frames")

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.is_disabled:
            return
        super().on_train_epoch_start(trainer, pl_module)
        if self.progress is not None and self.train_progress_bar_id is not None:
            self.progress.update(self.train_progress_bar_id, total=trainer.datamodule.collect.total_frames)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        now = time.perf_counter()
        if now - self._last_draw < self.refresh_every_s or self.is_disabled:
            return
        self._last_draw = now
        if self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.datamodule.frames)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    @override
    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        dm = trainer.datamodule
        elapsed = max(time.perf_counter() - self._t0, 1e-9)
        out: dict[str, Any] = {"sps": f"{(dm.frames - self._f0) / elapsed:.0f}"}
        if dm.recent_returns:
            out["return"] = f"{sum(dm.recent_returns) / len(dm.recent_returns):.1f}"
        ev = trainer.callback_metrics.get("eval/return_mean")
        if ev is not None:
            out["eval"] = f"{float(ev):.1f}"
        return out
