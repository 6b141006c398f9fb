"""What each update returns goes where it belongs: priorities to the replay, metrics to the loggers."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from typing_extensions import override

from rl_lightning.algos.base import PRIORITY_KEY
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
    episodes finished after the last interval are logged at the end of the epoch. New replay priorities
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

    def due_updates(self, trainer: L.Trainer) -> float:
        """The update count at which the next metrics are logged (at the end of the batch that reaches it)."""
        return trainer.datamodule.updates - self._since_log + self.log_every_n_updates

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not isinstance(outputs, dict) or outputs.get("metrics") is None:
            return
        self._since_log += int(outputs.get("updates", 1))
        if self._since_log >= self.log_every_n_updates:
            self._since_log = 0
            dm = trainer.datamodule
            metrics: dict[str, Any] = {  # a key with its own group ("options/usage_min") is kept as is
                (k if "/" in k else f"train/{k}"): v
                for k, v in outputs["metrics"].items()
                if k != PRIORITY_KEY and isinstance(v, torch.Tensor) and v.dim() == 0
            }
            metrics.update(self._episode_metrics(trainer, dm))
            log_metrics(trainer, metrics, dm.frames)

    @staticmethod
    def _episode_metrics(trainer: L.Trainer, dm: Any) -> dict[str, float]:
        """Episode statistics of the data path, summed over the ranks of a data-parallel run."""
        episodes = dm.pop_episodes()
        totals = torch.tensor(
            [dm.episodes, len(episodes), sum(r for r, _ in episodes), sum(n for _, n in episodes)],
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
        dm = trainer.datamodule
        if dm is not None and hasattr(dm, "pop_episodes"):
            log_metrics(trainer, self._episode_metrics(trainer, dm), dm.frames)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"since_log": self._since_log}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._since_log = int(state_dict.get("since_log", 0))
