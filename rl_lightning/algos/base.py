"""The base LightningModule of every algorithm: manual optimization around the hot-path protocol.

The protocol (see DESIGN.md) that optimization callbacks rely on:

* ``update(batch) -> TensorDict``: one full gradient step, returning detached metrics;
* ``act(td) -> TensorDict``: the exploring policy used for collection (writes ``"action"``);
* ``hot_paths``: the names of those methods (callbacks replace them on the instance);
* ``optimizer_kwargs``: merged into every optimizer constructor (``fused``, ``capturable``, ...);
* ``cuda_graph_safe``: the hot paths that may be captured as CUDA graphs.

Subclasses implement ``update``, ``act``, ``act_eval`` (deterministic, for evaluation) and
``configure_optimizers`` (through :meth:`make_optimizer`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import TensorSpec

from rl_lightning.metrics import log_metrics

__all__ = ["IncompatibleEnvError", "RLModule"]


class IncompatibleEnvError(ValueError):
    """The algorithm does not fit the environment (for example DQN on continuous actions)."""


class RLModule(L.LightningModule):
    """Base class: frame counter, logging every N updates, PER priority write-back.

    Args:
        observation_spec: the env's observation spec (batch dims included; the last dims are the shape).
        action_spec: the env's action spec.
        log_every_n_updates: log the update metrics every this many updates (one host sync each time).
    """

    hot_paths: tuple[str, ...] = ("update", "act")
    cuda_graph_safe: tuple[str, ...] = ()

    def __init__(self, observation_spec: TensorSpec, action_spec: TensorSpec, log_every_n_updates: int = 100):
        super().__init__()
        if log_every_n_updates < 1:
            raise ValueError("log_every_n_updates must be >= 1.")
        self.automatic_optimization = False
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.log_every_n_updates = log_every_n_updates
        self.optimizer_kwargs: dict[str, Any] = {}
        # Frames seen so far, on the module's device, so schedules need no host sync.
        self.register_buffer("frames", torch.zeros((), dtype=torch.float32))
        self._updates_since_log = 0
        self._standalone_optimizers: list[torch.optim.Optimizer] | None = None

    # ------------------------------------------------------------------ protocol
    def update(self, batch: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    def act(self, td: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    # ------------------------------------------------------------------ helpers
    @property
    def obs_shape(self) -> torch.Size:
        """Shape of one observation (without the env batch dimension)."""
        return self.observation_spec["observation"].shape[1:]

    def set_frames(self, frames: int) -> None:
        """Called by the data module after each collection (an in-place fill: no sync, graph-safe)."""
        self.frames.fill_(float(frames))

    def optimizer(self, index: int = 0) -> torch.optim.Optimizer:
        """The ``index``-th optimizer: Lightning's wrapper under a Trainer, else the module's own.

        Outside a Trainer (unit tests, hand-written loops, benchmarks) the optimizers come from
        ``configure_optimizers`` once and are kept on the module.
        """
        if self._trainer is not None:
            opts = self.optimizers()
            return opts[index] if isinstance(opts, list) else opts
        if self._standalone_optimizers is None:
            opts = self.configure_optimizers()
            self._standalone_optimizers = list(opts) if isinstance(opts, list | tuple) else [opts]
        return self._standalone_optimizers[index]

    def backward_loss(self, loss: torch.Tensor) -> None:
        """``manual_backward`` under a Trainer (precision plugins, grad scaling), plain backward otherwise."""
        if self._trainer is not None:
            self.manual_backward(loss)
        else:
            loss.backward()

    def make_optimizer(self, params: Iterable[Any], lr: float, **kwargs: Any) -> torch.optim.Optimizer:
        """``Adam`` with the callbacks' ``optimizer_kwargs`` merged in."""
        kwargs = {**kwargs, **self.optimizer_kwargs}
        if not isinstance(lr, torch.Tensor) and kwargs.get("capturable"):
            lr = torch.tensor(lr)
        return torch.optim.Adam(params, lr=lr, **kwargs)

    def extra_train_metrics(self) -> dict[str, torch.Tensor]:
        """Metrics logged with the update metrics (for example epsilon)."""
        return {}

    # ------------------------------------------------------------------ Lightning hooks
    def training_step(self, batch: TensorDictBase, batch_idx: int) -> None:
        metrics = self.update(batch)
        if "td_error" in batch.keys() and "priority_weight" in batch.keys():
            # Prioritized replay: the loss wrote |TD error| into the batch; feed it back as priorities.
            self.trainer.datamodule.replay.update_priority(batch.get("index"), batch.get("td_error"))
        self._updates_since_log += 1
        if self._updates_since_log >= self.log_every_n_updates:
            self._updates_since_log = 0
            self._log_train(metrics)

    def _log_train(self, metrics: TensorDictBase) -> None:
        dm = self.trainer.datamodule
        out: dict[str, Any] = {f"train/{k}": v for k, v in metrics.items()}
        out.update({f"train/{k}": v for k, v in self.extra_train_metrics().items()})
        out.update(self._episode_metrics())
        log_metrics(self.trainer, out, dm.frames)

    def _episode_metrics(self) -> dict[str, float]:
        dm = self.trainer.datamodule
        out: dict[str, float] = {"train/episodes": dm.episodes}
        episodes = dm.pop_episodes()
        if episodes:
            out["train/episode_return"] = sum(r for r, _ in episodes) / len(episodes)
            out["train/episode_length"] = sum(n for _, n in episodes) / len(episodes)
        return out

    def on_train_epoch_end(self) -> None:
        # Episodes that finished after the last logging interval are not lost at the end of the run.
        dm = self.trainer.datamodule
        if dm is not None and hasattr(dm, "pop_episodes"):
            log_metrics(self.trainer, self._episode_metrics(), dm.frames)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["updates_since_log"] = self._updates_since_log

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._updates_since_log = checkpoint.get("updates_since_log", 0)

    @staticmethod
    def empty_metrics(device: torch.device) -> TensorDict:
        """An empty metrics TensorDict on ``device``."""
        return TensorDict({}, batch_size=[], device=device)
