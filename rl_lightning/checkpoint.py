"""Checkpoints every N environment frames, with the replay buffer beside the ``last`` checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

__all__ = ["FrameCheckpoint", "replay_path"]


def replay_path(ckpt_path: str | Path) -> Path:
    """Where the replay buffer of checkpoint ``ckpt_path`` lives."""
    return Path(str(ckpt_path) + ".replay")


class FrameCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` driven by environment frames instead of steps or epochs.

    Every ``every_frames`` frames, at the end of training and on an exception (Ctrl-C included) it
    saves ``last.ckpt`` together with the replay buffer (``last.ckpt.replay/``), and keeps the best
    checkpoint by ``monitor`` (``eval/return_mean`` by default). Resuming from ``last`` therefore
    continues with the same buffer content.

    Args:
        every_frames: checkpoint interval in frames.
        **kwargs: passed to ``ModelCheckpoint`` (``dirpath``, ``monitor``, ``mode``, ``save_top_k``...).
    """

    def __init__(self, every_frames: int, **kwargs: Any) -> None:
        if every_frames < 1:
            raise ValueError("checkpoint.every_frames must be >= 1.")
        kwargs.setdefault("save_last", True)
        kwargs.setdefault("save_on_exception", True)
        kwargs.setdefault("auto_insert_metric_name", False)
        super().__init__(**kwargs)
        self.every_frames = every_frames
        self._saved_frames = 0

    def _save_now(self, trainer: L.Trainer) -> None:
        if self._should_skip_saving_checkpoint(trainer):
            return
        self._saved_frames = trainer.datamodule.frames
        candidates = self._monitor_candidates(trainer)
        if self.monitor is None or self.monitor in candidates:
            self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.datamodule.frames - self._saved_frames >= self.every_frames:
            self._save_now(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._save_now(trainer)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Only 'last' (with its buffer): the state at a crash or Ctrl-C is not a candidate for 'best'.
        if self.save_on_exception and not self._should_skip_saving_checkpoint(trainer):
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))

    @override
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        if Path(filepath).stem.startswith(self.CHECKPOINT_NAME_LAST) and trainer.is_global_zero:
            # Buffer first: a 'last' checkpoint on disk always has its buffer beside it.
            trainer.datamodule.save_replay(replay_path(filepath))
        super()._save_checkpoint(trainer, filepath)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "saved_frames": self._saved_frames}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self._saved_frames = state_dict.get("saved_frames", 0)
