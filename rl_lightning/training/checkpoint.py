"""Checkpoints every N environment frames, with the replay buffer beside the ``last`` checkpoint."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Checkpoint
from typing_extensions import override

from rl_lightning.data.budget import Mark
from rl_lightning.training.safe_load import CONFIG_KEY, FORMAT_VERSION

__all__ = ["ConfigInCheckpoint", "FrameCheckpoint", "replay_path"]


def replay_path(ckpt_path: str | Path) -> Path:
    """Where the replay buffer of checkpoint ``ckpt_path`` lives."""
    return Path(str(ckpt_path) + ".replay")


class ConfigInCheckpoint(L.Callback):
    """Stores the resolved config and the format version in every checkpoint (``evaluate`` rebuilds from it).

    Args:
        config: the run's resolved config as plain containers (the safe loader accepts nothing else).
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[CONFIG_KEY] = {"config": self.config, "format": FORMAT_VERSION}


class FrameCheckpoint(Checkpoint):
    """Saves ``last.ckpt`` every ``every_frames`` frames and ``best.ckpt`` whenever an evaluation beats it.

    ``last.ckpt`` is written with the replay buffer beside it (``last.ckpt.replay/``, written first, so a
    ``last`` checkpoint on disk always has its buffer; with several ranks one shard per rank) every
    ``every_frames`` environment frames, at the end of training and on an exception. Resuming from it
    continues with the same buffer content. The buffer is the data path's to write: this callback says
    when and where (``save_replay``: the data module's ``save_replay``), and the data module loads it back
    (its ``resume_replay_from``). Frames come from the progress view,
    with which the callback registers its ``last.ckpt`` mark.

    ``best.ckpt`` is written at the evaluation that produced a new best ``monitor`` value, so it holds
    exactly the weights that were evaluated: ``evaluate ckpt=best.ckpt`` with the evaluation's seed
    reproduces the score. A new evaluation is a new value of ``monitor`` in ``trainer.callback_metrics``
    (the evaluation callback runs before this one).

    A ``Checkpoint`` (Lightning's public base class): Lightning runs it after the other callbacks, whose
    state is then up to date, and adds no checkpoint callback of its own. Files are written through
    ``Trainer.save_checkpoint`` (Lightning's public API, so every callback's and
    the data module's state is in them) to a temporary name and renamed, so an interruption never leaves
    a half-written checkpoint.

    Args:
        dirpath: the directory of ``last.ckpt`` and ``best.ckpt``.
        every_frames: checkpoint interval in frames.
        monitor: the metric that picks ``best.ckpt`` (``None``: no best checkpoint).
        mode: ``max`` or ``min``.
        save_on_exception: write ``last.ckpt`` when training stops with an exception.
        save_replay: writes the replay buffer (this rank's shard) to the directory it is given; ``None``:
            checkpoints without a buffer beside them.
    """

    LAST = "last.ckpt"
    BEST = "best.ckpt"

    def __init__(
        self,
        dirpath: str | Path,
        every_frames: int,
        monitor: str | None = "eval/return_mean",
        mode: str = "max",
        save_on_exception: bool = True,
        save_replay: Callable[[Path], None] | None = None,
    ) -> None:
        if every_frames < 1:
            raise ValueError("checkpoint.every_frames must be >= 1.")
        if mode not in ("max", "min"):
            raise ValueError(f"checkpoint.mode={mode!r} must be 'max' or 'min'.")
        self.dirpath = Path(dirpath)
        self.every_frames = every_frames
        self.monitor = monitor
        self.mode = mode
        self.save_on_exception = save_on_exception
        self.save_replay = save_replay
        self.mark = Mark("frames", every_frames)
        self.best_score: float | None = None
        self.best_frames: int | None = None
        self.last_score: float | None = None
        self.last_eval_frames: int | None = None
        self._seen: Any = None
        self._training = False

    @property
    def saved_frames(self) -> int:
        """The frame count of the last ``last.ckpt``."""
        return self.mark.last

    @property
    def last_path(self) -> Path:
        return self.dirpath / self.LAST

    @property
    def best_path(self) -> Path:
        return self.dirpath / self.BEST

    # ------------------------------------------------------------------ writing
    def _write(self, trainer: L.Trainer, path: Path, with_replay: bool) -> None:
        if with_replay and self.save_replay is not None:  # every rank its own shard (one process: all)
            self.save_replay(replay_path(path))
        tmp = path.with_name(path.name + ".tmp")
        trainer.save_checkpoint(tmp, weights_only=False)
        if trainer.is_global_zero:
            os.replace(tmp, path)

    def _better(self, score: float) -> bool:
        if not math.isfinite(score):
            return False
        if self.best_score is None:
            return True
        return score > self.best_score if self.mode == "max" else score < self.best_score

    def _check_best(self, trainer: L.Trainer) -> None:
        if self.monitor is None:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is None or value is self._seen:
            return
        self._seen = value
        score = float(value)
        self.last_score = score
        self.last_eval_frames = trainer.datamodule.progress.frames
        if self._better(score):
            self.best_score = score
            self.best_frames = self.last_eval_frames
            self._write(trainer, self.best_path, with_replay=False)

    def save_last(self, trainer: L.Trainer) -> None:
        """Writes ``last.ckpt`` with its replay buffer now."""
        self.mark.last = trainer.datamodule.progress.frames
        self._write(trainer, self.last_path, with_replay=True)

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # The batch that reaches the next last.ckpt ends there; best.ckpt follows the evaluations, whose
        # batch ends are due on their own.
        if stage == "fit":
            trainer.datamodule.progress.register_mark(self.mark)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = True

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._training = False

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._check_best(trainer)
        if trainer.datamodule.progress.due(self.mark):
            self.save_last(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_best(trainer)
        self.save_last(trainer)

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        # Only 'last' (with its buffer): the state at a crash is not a candidate for 'best'. Only once
        # training has started: a failure while restoring a checkpoint must not overwrite it.
        if self.save_on_exception and self._training:
            self._training = False
            self.save_last(trainer)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "saved_frames": self.saved_frames,
            "best_score": self.best_score,
            "best_frames": self.best_frames,
            "last_score": self.last_score,
            "last_eval_frames": self.last_eval_frames,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.mark.last = int(state_dict.get("saved_frames", 0))
        self.best_score = state_dict.get("best_score")
        self.best_frames = state_dict.get("best_frames")
        self.last_score = state_dict.get("last_score")
        self.last_eval_frames = state_dict.get("last_eval_frames")
        if isinstance(self.best_score, torch.Tensor):
            self.best_score = float(self.best_score)
