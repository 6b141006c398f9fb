"""What each update returns goes where it belongs: priorities to the replay, metrics to the loggers."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from typing_extensions import override

from rl_lightning.algos.base import PRIORITY_KEY
from rl_lightning.data.budget import Mark
from rl_lightning.data.progress import EpisodeReader, Progress
from rl_lightning.training.metrics import log_metrics

__all__ = ["UpdateFeedback"]


class UpdateFeedback(L.Callback):
    """Logs what ``RLModule.update`` returned, every ``log_every_n_updates`` updates.

    ``training_step`` returns ``{"metrics": the last update's output, "updates": updates done}`` (a batch
    of the experience stream is a round of updates). Every ``log_every_n_updates`` updates the scalar
    metrics of the latest update are logged as ``train/<name>`` (a name with a group of its own, such as
    ``options/usage_min``, as it is; one host sync for all of them), with the
    data path's ``train/episodes``, ``train/episode_return`` and ``train/episode_length`` (means over the
    episodes finished since the last log, on every rank of a data-parallel run), against frames. The
    episodes finished after the last interval are logged at the end of the epoch. Frames and episodes come
    from the progress view (``trainer.datamodule.progress``; the episodes through a reader of its own, which
    takes them from no one else), with which the callback registers its update mark. New replay priorities
    are not this callback's: the data path applies them after every update.

    The algorithm never sees the data module; the data module never sees the algorithm's losses.

    Args:
        log_every_n_updates: logging interval in updates.

    Example:
        ``Trainer(callbacks=[UpdateFeedback(log_every_n_updates=100), ...])`` (``fit`` adds it).
    """

    def __init__(self, log_every_n_updates: int = 100) -> None:
        if log_every_n_updates < 1:
            raise ValueError(f"log_every_n_updates={log_every_n_updates} must be >= 1.")
        self.log_every_n_updates = log_every_n_updates
        self._since_log = 0
        #: Due at the update count of the next log (the batch that reaches it ends there).
        self.mark = Mark("updates", log_every_n_updates)
        self._episodes: EpisodeReader | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            progress = trainer.datamodule.progress
            progress.register_mark(self.mark)
            self._episodes = progress.episode_reader()

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # After a resume: the updates of the interval under way count (since_log is in the checkpoint).
        self.mark.last = trainer.datamodule.progress.updates - self._since_log

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(outputs, dict) or outputs.get("metrics") is None:
            return
        self._since_log += int(outputs.get("updates", 1))
        if self._since_log >= self.log_every_n_updates:
            self._since_log = 0
            progress = trainer.datamodule.progress
            self.mark.last = progress.updates
            metrics: dict[str, Any] = {  # a key with its own group ("options/usage_min") is kept as is
                (k if "/" in k else f"train/{k}"): v
                for k, v in outputs["metrics"].items()
                if k != PRIORITY_KEY and isinstance(v, torch.Tensor) and v.dim() == 0
            }
            metrics.update(self._episode_metrics(trainer, progress))
            log_metrics(trainer, metrics, progress.frames)

    def _episode_metrics(self, trainer: L.Trainer, progress: Progress) -> dict[str, float]:
        """Episode statistics of the data path, summed over the ranks of a data-parallel run."""
        episodes = self._episodes.read() if self._episodes is not None else []
        totals = torch.tensor(
            [progress.episodes, len(episodes), sum(r for r, _ in episodes), sum(n for _, n in episodes)],
            dtype=torch.float64,
        )
        if trainer.world_size > 1:  # every rank logs at the same update: a collective is safe here
            totals = trainer.strategy.reduce(totals.to(trainer.strategy.root_device), reduce_op="sum").cpu()
        total_episodes, count, returns, lengths = totals.tolist()
        out: dict[str, float] = {"train/episodes": total_episodes}
        if count:
            out["train/episode_return"] = returns / count
            out["train/episode_length"] = lengths / count
        return out

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        progress = trainer.datamodule.progress
        log_metrics(trainer, self._episode_metrics(trainer, progress), progress.frames)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"since_log": self._since_log}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._since_log = int(state_dict.get("since_log", 0))
