"""The experience stream: TorchRL collector -> replay buffer -> sampled batches, as a LightningDataModule.

One item of the stream is one gradient update's batch. Between items the stream collects
``frames_per_batch`` frames with the module's acting policy whenever the update-to-data ratio says so,
extends the replay buffer and, once the warm-up frames are in, yields samples. The run's budget is
``total_frames`` environment frames: the stream ends there, and so does the (single) Lightning epoch.
"""

from __future__ import annotations

import random
import shutil
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.collectors import Collector

from rl_lightning.algos.base import ReplayRequirements
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.replay import (
    TRAJ_KEY,
    ReplayConfig,
    make_replay_buffer,
    resolve_device,
    resolve_replay,
)
from rl_lightning.data.safety import check_replay_dir
from rl_lightning.envs.factory import EnvConfig, make_env

__all__ = ["CollectConfig", "ExperienceStream", "RLDataModule"]


@dataclass
class CollectConfig:
    """What the ``collect`` node of the config holds; see the configuration reference."""

    total_frames: int = 100_000
    frames_per_batch: int = 1
    warmup_frames: int = 1_000
    updates_per_frame: float = 1.0
    warmup_burst: bool = False

    def __post_init__(self) -> None:
        if self.total_frames < 1 or self.frames_per_batch < 1:
            raise ValueError("total_frames and collect.frames_per_batch must be positive.")
        if self.updates_per_frame <= 0:
            raise ValueError("collect.updates_per_frame must be > 0 (for example 0.25 or 1).")
        if self.warmup_frames < 0:
            raise ValueError("collect.warmup_frames must be >= 0.")


def _numpy_state_to_plain(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return (name, keys.tolist(), int(pos), int(has_gauss), float(cached))


def _numpy_state_from_plain(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached)


class _Policy:
    """Calls ``module.act`` at call time, so callbacks that replace ``act`` are honoured."""

    def __init__(self, module: L.LightningModule) -> None:
        self.module = module

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return self.module.act(td)


class ExperienceStream:
    """Iterable over training batches; owned by :class:`RLDataModule` (see the module docstring)."""

    def __init__(self, dm: RLDataModule) -> None:
        self.dm = dm

    def __iter__(self) -> Iterator[TensorDictBase]:
        dm = self.dm
        cfg = dm.collect
        trainer = dm.trainer
        collector = dm.make_collector()
        try:
            it = iter(collector)
            while True:
                # Updates granted but not yet done (also those owed when a checkpoint was taken).
                while dm.owed_updates > 0:
                    if trainer.should_stop:  # a stop request (Ctrl-C, a callback) between updates
                        return
                    dm.owed_updates -= 1
                    dm.updates += 1
                    yield dm.replay.sample()
                if dm.frames >= cfg.total_frames:
                    # The budget is in frames: end this epoch and the fit (max_epochs is unbounded so
                    # that a finished run resumed with a larger total_frames continues).
                    trainer.should_stop = True
                    return
                if trainer.should_stop:  # ... or between collections (the warm-up yields no updates)
                    return
                batch = dm.trim_to_budget(next(it))
                dm.add_frames(batch)
                if dm.frames >= cfg.warmup_frames:
                    dm.owed_updates += dm.updates_due(batch.numel())
        finally:
            collector.shutdown()


class RLDataModule(L.LightningDataModule):
    """Owns the training env, the TorchRL collector, the replay buffer and the frame budget.

    The replay buffer's sampler follows the algorithm's :class:`ReplayRequirements` (slices or transitions,
    n-step discount); a replay config that contradicts them fails here, before anything runs. The data
    module is the algorithm's only source of data and the loop's source of frame and episode counts; the
    algorithm's feedback (new priorities) comes back through :meth:`update_priority`.

    Args:
        env: the env config (training envs; evaluation builds its own from the same config).
        replay: the replay buffer config (``slice_len`` may be unset: it follows ``requirements``).
        collect: frame budget, collection size, warm-up and update-to-data ratio.
        requirements: what the algorithm needs from the replay (its ``replay_requirements()``).
        seed: the run's seed (env ``i`` gets ``seed + i``; a resumed run reseeds from the frame count).
        algorithm: the algorithm's name, for error messages.

    Resumable state (``state_dict``): the frame and update counters, episode statistics and the global
    RNG states. The replay buffer is saved beside the checkpoint by the checkpoint callback
    (``<ckpt>.replay/``) rather than inside it, so a large buffer is not copied into every checkpoint.
    """

    def __init__(
        self,
        env: EnvConfig,
        replay: ReplayConfig,
        collect: CollectConfig,
        requirements: ReplayRequirements,
        seed: int = 0,
        algorithm: str = "the algorithm",
    ) -> None:
        super().__init__()
        self.env_cfg = env
        self.requirements = requirements
        self.replay_cfg = resolve_replay(replay, requirements, algorithm)
        self.collect = collect
        self.seed = seed
        self.frames = 0
        self.updates = 0
        self.owed_updates = 0
        self.episodes = 0
        self._update_credit = 0.0
        self._burst_done = False
        self.recent_returns: deque[float] = deque(maxlen=20)
        self.replay = None
        self.nstep = NStepReturns(replay.n_step, requirements.discount) if replay.n_step > 1 else None
        self._pending_episodes: list[tuple[float, int]] = []
        self.resume_replay_from: str | None = None
        self.resumed_frames = 0  # frames at the start of this process's fit (non-zero after a resume)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        if self.replay is None:
            self.replay = make_replay_buffer(self.replay_cfg, interleaved=self.env_cfg.num_envs > 1)

    def train_dataloader(self) -> ExperienceStream:
        return ExperienceStream(self)

    def state_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "updates": self.updates,
            "owed_updates": self.owed_updates,
            "episodes": self.episodes,
            "update_credit": self._update_credit,
            "burst_done": self._burst_done,
            "recent_returns": list(self.recent_returns),
            "rng": {
                "torch": torch.get_rng_state(),
                # Plain Python values: checkpoints load with torch.load(weights_only=True).
                "numpy": _numpy_state_to_plain(np.random.get_state()),
                "python": random.getstate(),
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.frames = self.resumed_frames = int(state["frames"])
        self.updates = int(state["updates"])
        self.owed_updates = int(state["owed_updates"])
        self.episodes = int(state["episodes"])
        self._update_credit = float(state["update_credit"])
        self._burst_done = bool(state["burst_done"])
        self.recent_returns.extend(state["recent_returns"])
        torch.set_rng_state(state["rng"]["torch"])
        np.random.set_state(_numpy_state_from_plain(state["rng"]["numpy"]))
        random.setstate(state["rng"]["python"])
        if self.resume_replay_from is not None:
            self.load_replay(self.resume_replay_from)

    # ------------------------------------------------------------------ replay persistence
    def save_replay(self, path: str | Path) -> None:
        """Writes the replay buffer to the directory ``path`` (atomically replaced)."""
        if self.replay is None:
            return
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.replay.dumps(tmp)
        shutil.rmtree(path, ignore_errors=True)
        tmp.rename(path)

    def load_replay(self, path: str | Path) -> None:
        """Restores the replay buffer written by :meth:`save_replay`.

        Raises:
            FileNotFoundError: when the directory is missing (the checkpoint was saved without it).
            UnsafeFileError: the directory holds something loading would have to run (see
                :func:`rl_lightning.data.safety.check_replay_dir`).
        """
        path = Path(path)
        check_replay_dir(path)  # nothing of it is read before it passed
        if self.replay is None:
            self.replay = make_replay_buffer(self.replay_cfg, interleaved=self.env_cfg.num_envs > 1)
        self.replay.loads(path)

    # ------------------------------------------------------------------ the stream's work
    def make_collector(self) -> Collector:
        """A TorchRL ``Collector`` over fresh training envs, acting with ``module.act``."""
        module = self.trainer.lightning_module
        if self.nstep is not None:
            self.nstep.reset()
        # A resumed run continues the seed sequence instead of replaying its first episodes.
        env = make_env(self.env_cfg, seed=self.seed + self.frames)
        storing = resolve_device(self.replay_cfg.device)
        collector = Collector(
            env,
            _Policy(module),
            frames_per_batch=self.collect.frames_per_batch,
            total_frames=-1,
            init_random_frames=self._random_frames_left(),
            policy_device=module.device,
            env_device="cpu",
            storing_device=storing,
            trust_policy=True,
            track_traj_ids=self.replay_cfg.slice_len is not None,
        )
        next_id = self._next_traj_id()
        if next_id:
            # A resumed run's trajectories must not reuse the ids of those in the buffer: the sequence
            # sampler would join a new trajectory to an old one with the same id.
            collector.load_state_dict(
                {"frames": 0, "iter": 0, "traj_pool": {"traj_id": torch.tensor(next_id, dtype=torch.int)}},
                strict=False,
            )
        return collector

    def _next_traj_id(self) -> int:
        """One past the largest trajectory id in the replay buffer (0 when it holds none)."""
        if self.replay_cfg.slice_len is None or self.replay is None or len(self.replay) == 0:
            return 0
        stored = self.replay.storage[: len(self.replay)]
        return int(stored.get(TRAJ_KEY).max()) + 1

    def _random_frames_left(self) -> int | None:
        # The collector rounds random frames up to whole collections; round here so it has no reason to warn.
        left = max(0, self.collect.warmup_frames - self.frames)
        fpb = self.collect.frames_per_batch
        return -(-left // fpb) * fpb or None

    def trim_to_budget(self, batch: TensorDictBase) -> TensorDictBase:
        """Drops the time steps of a collected ``[num_envs, T]`` batch past ``total_frames``.

        The run then ends at exactly ``total_frames`` frames when the number of envs divides it (else at
        the next multiple of it), whatever ``frames_per_batch``.
        """
        left = self.collect.total_frames - self.frames
        if batch.numel() <= left:
            return batch
        n_envs = batch.shape[0] if batch.batch_dims > 1 else 1
        steps = -(-left // n_envs)
        return batch[..., :steps]

    def add_frames(self, batch: TensorDictBase) -> None:
        """Counts a collected batch ``[num_envs, T]``, records finished episodes and extends the buffer."""
        if self.requirements.extra_keys and self.frames >= self.collect.warmup_frames:
            missing = [k for k in self.requirements.extra_keys if k not in batch.keys(True)]
            if missing:
                raise KeyError(
                    f"the algorithm's act must write {missing} (declared in its replay requirements) "
                    "into the collected data."
                )
        done = batch.get(("next", "done")).squeeze(-1)
        if done.any():
            returns = batch.get(("next", "episode_reward"))[done].squeeze(-1).tolist()
            lengths = batch.get(("next", "step_count"))[done].squeeze(-1).tolist()
            self.recent_returns.extend(returns)
            self._pending_episodes.extend(zip(returns, lengths))
            self.episodes += len(returns)
        if self.nstep is not None:
            batch = self.nstep(batch)
        self.replay.extend(batch.reshape(-1))
        self.frames += done.numel()
        module = self.trainer.lightning_module
        if hasattr(module, "set_frames"):
            module.set_frames(self.frames)

    def updates_due(self, new_frames: int) -> int:
        """How many updates the update-to-data ratio grants for ``new_frames`` new frames."""
        self._update_credit += new_frames * self.collect.updates_per_frame
        if self.collect.warmup_burst and not self._burst_done:
            # TD-MPC2's seeding: one burst of as many updates as there were warm-up frames.
            self._burst_done = True
            self._update_credit += self.collect.warmup_frames * self.collect.updates_per_frame
        n = int(self._update_credit)
        self._update_credit -= n
        return n

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        """New priorities for the sampled rows ``index`` (what a prioritized ``update`` returned)."""
        if not self.replay_cfg.prioritized:
            raise RuntimeError("update_priority on a replay buffer that is not prioritized.")
        self.replay.update_priority(index, priority)

    def pop_episodes(self) -> list[tuple[float, int]]:
        """Episodes (return, length) finished since the last call."""
        out, self._pending_episodes = self._pending_episodes, []
        return out
