"""The data path as a LightningDataModule: the parts of :mod:`rl_lightning.data`, wired through Lightning.

The parts, each with one owner of its state:

- :class:`~rl_lightning.data.budget.FrameBudget`: frames, updates owed, the update-to-data credit and the
  marks callbacks act at;
- :class:`~rl_lightning.data.progress.Progress`: the read-only view of frames, totals, warm-up and finished
  episodes that everyone outside the data path reads;
- :mod:`~rl_lightning.data.collection`: the TorchRL collector of the training envs;
- :class:`~rl_lightning.data.ingest.Ingestion`: episode statistics and rows into the replay;
- :class:`~rl_lightning.data.stream.ExperienceStream`: collect, extend, then sample and update;
- :mod:`~rl_lightning.data.persistence`: replay shards and per-rank random state beside a checkpoint
  (saved when the checkpoint callback asks, loaded from the ``resume_replay_from`` given here);
- :class:`~rl_lightning.data.transfer.DeviceCopies`: every host/device copy, plain or non-blocking.

:class:`RLDataModule` takes everything in its constructor, builds the replay in ``setup`` and hands the
stream to Lightning as the train iterable. The module learns the frame count through one call
(``set_frames``); callbacks read ``trainer.datamodule.progress`` and nothing else of the data module (the
device copies' switch too: ``progress.copies``). The training envs are reached from outside through one
port, :class:`TrainingEnvs`.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import lightning as L
import numpy as np
import torch
from tensordict import TensorDict

from rl_lightning.compat import collector_carrier, set_collector_carrier
from rl_lightning.data import persistence
from rl_lightning.data.budget import FrameBudget, Mark
from rl_lightning.data.collection import CollectConfig, Collection, call_training_envs, start_collection
from rl_lightning.data.frames import FrameReplay, stores_frames
from rl_lightning.data.ingest import Ingestion
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.progress import Progress
from rl_lightning.data.replay import TRAJ_KEY, ReplayConfig, make_replay_buffer, resolve_replay
from rl_lightning.data.rollout import RolloutBuffer
from rl_lightning.data.stream import MAX_UPDATES_PER_BATCH, ExperienceStream, UpdateRound
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.device import resolve_device
from rl_lightning.envs.factory import EnvConfig, agent_group_of

__all__ = [
    "MAX_UPDATES_PER_BATCH", "RANK_SEED_STRIDE", "CollectConfig", "ExperienceStream", "RLDataModule",
    "TrainingEnvs", "UpdateRound", "UsesTrainingEnvs",
]  # fmt: skip

#: Seed offset between ranks (their envs and exploration noise); larger than any frame count of a run.
RANK_SEED_STRIDE = 1_000_003


class TrainingEnvs:
    """The one port to a run's training envs from outside the data path: :meth:`call` calls a method on
    every training env now and on the envs of every later collector (hockey's ``set_curriculum``)."""

    def __init__(self, datamodule: RLDataModule) -> None:
        self._dm = datamodule

    def call(self, method: str, **kwargs: Any) -> None:
        """Calls ``method(**kwargs)`` on every training env (see :func:`.collection.call_training_envs`).

        Raises:
            ValueError: the envs live in worker processes (``collect.workers > 0``), out of reach.
            AttributeError: the env has no such method.
        """
        self._dm.call_training_envs(method, **kwargs)


@runtime_checkable
class UsesTrainingEnvs(Protocol):
    """A callback that changes what the training envs play: the run's wiring hands it the port."""

    def connect_training_envs(self, envs: TrainingEnvs) -> None:
        """Keeps ``envs``, the way to the training envs."""


class RLDataModule(L.LightningDataModule):
    """Owns the training envs' collector, the replay buffer and the frame budget of a run.

    The replay's sampler follows the algorithm's ``replay_requirements()`` (slices or transitions, n-step
    discount); a replay config that contradicts them fails here, before anything runs. An on-policy
    algorithm (its requirements name a ``rollout``) gets a :class:`~.rollout.RolloutBuffer` in the replay's
    place: each collection is one rollout, granted its ``epochs × minibatches`` updates.

    Args:
        env: the env config (training envs; evaluation builds its own from the same config).
        replay: the replay config (``device=auto`` follows ``device``).
        collect: frame budget, collection size, warm-up and update-to-data ratio.
        module: the algorithm: its ``act`` is the collector's policy, its ``replay_requirements()`` shape
            the replay, and it learns the frame count through ``set_frames``.
        device: where the module runs (the run resolves it once).
        seed: the run's seed (env ``i`` gets ``seed + i``; a resumed run reseeds from the frame count).
        stop_request: returns True when a stop was requested (Ctrl-C).
        resume_replay_from: the replay directory of the checkpoint the run resumes from (loaded with the
            data module's state), ``None`` for a new run.

    Resumable state (``state_dict``): the budget's counters, the episode statistics, the global RNG states
    and the collection's state (``collection``: the training envs' states, the collector's carried step and
    the n-step windows held back; ``None`` where the envs' state cannot be saved, see
    :mod:`rl_lightning.envs.state`), so that a resumed run continues every episode where it was; the replay
    is saved beside the checkpoint (:meth:`save_replay`, which the checkpoint callback calls) and loaded
    from ``resume_replay_from``. Data-parallel runs: every rank
    owns its envs (seeded apart), collector and replay shard; the budget counts all ranks' frames, and every
    stop decision is collective, so the ranks always stop after the same update.
    """

    def __init__(
        self,
        env: EnvConfig,
        replay: ReplayConfig,
        collect: CollectConfig,
        module: Any,
        device: torch.device | str = "cpu",
        seed: int = 0,
        stop_request: Callable[[], bool] | None = None,
        resume_replay_from: str | Path | None = None,
    ) -> None:
        super().__init__()
        self.env_cfg, self.module, self.seed = env, module, seed
        self.requirements = module.replay_requirements()
        self.replay_cfg = resolve_replay(replay, self.requirements, type(module).__name__)
        self._replay_follows = replay.device == "auto"  # the replay lives where the module does
        device = torch.device(device)
        self.copies = DeviceCopies(device, device if self._replay_follows else resolve_device(replay.device))
        rollout = self.requirements.rollout
        if rollout is not None:  # a collection is one rollout of the policy: no random warm-up frames
            envs = env.num_envs * max(1, collect.workers)
            collect = dataclasses.replace(collect, frames_per_batch=rollout.steps * envs, warmup_frames=0)
        self.collect = collect
        self.budget = FrameBudget(
            collect.total_frames, collect.warmup_frames, collect.updates_per_frame, collect.warmup_burst,
            updates_per_collection=None if rollout is None else rollout.epochs * rollout.minibatches,
        )  # fmt: skip
        nstep = NStepReturns(replay.n_step, self.requirements.discount) if replay.n_step > 1 else None
        self.observation_spec = module.observation_spec["observation"]
        self.store_frames = rollout is None and stores_frames(
            replay.store_frames, self.observation_spec, self.replay_cfg.slice_len
        )
        if self.store_frames and collect.workers and not collect.sync_workers:
            raise ValueError(
                "replay.store_frames follows each env's frames from batch to batch, which "
                "collect.sync_workers=false mixes up; set collect.sync_workers=true or "
                "replay.store_frames=false."
            )
        group = agent_group_of(env)
        if group is not None and (collect.workers or rollout is not None or self.replay_cfg.slice_len):
            raise ValueError(
                f"{env.id} has several agents per env, which the data path takes as transitions in this "
                "process: use an off-policy algorithm that samples transitions (DQN, IQN, AC-IQN, SAC, "
                "DDPG) with collect.workers=0."
            )
        self.ingestion = Ingestion(
            self.requirements, nstep, self.copies, collect.warmup_frames, store_frames=self.store_frames,
            agent_group=group,
        )  # fmt: skip
        self.stop_request = stop_request
        self.replay: Any = None
        self.resume_replay_from = None if resume_replay_from is None else str(resume_replay_from)
        self.progress = Progress(self.budget, self.ingestion.episodes, self.copies)
        self.training_envs = TrainingEnvs(self)
        self.resumed_frames = 0  # frames at the start of this process's fit (non-zero after a resume)
        self.rank, self.world_size = 0, 1
        self.collection: Collection | None = None
        #: The collection's state for the next collector to continue from: a closed collector's last one,
        #: or a checkpoint's (``None``: the next collector starts fresh episodes).
        self._collection_state: dict[str, Any] | None = None
        self._env_calls: dict[str, dict[str, Any]] = {}
        # A module that acts at every batch end gets every collection's batch end.
        if any(
            getattr(type(module), h, None) is not getattr(L.LightningModule, h)
            for h in ("on_train_batch_start", "on_train_batch_end")
        ):
            self.budget.register_mark(Mark("frames", every=0))

    # ---------------------------------------------------------------------------- counts
    @property
    def frames(self) -> int:
        """Env frames collected so far, all ranks (the budget's count; callbacks read ``progress``)."""
        return self.budget.frames

    @property
    def updates(self) -> int:
        return self.budget.updates

    @property
    def episodes(self) -> int:
        return self.ingestion.episodes.count

    @property
    def training_env(self) -> Any:
        """The live collector's training env (``collect.workers=0``), ``None`` between collectors."""
        return self.collection.env if self.collection is not None else None

    # ---------------------------------------------------------------------------- Lightning hooks
    def setup(self, stage: str) -> None:
        if self.trainer is not None:
            self.rank, self.world_size = self.trainer.global_rank, self.trainer.world_size
            # This rank's device: the run's, with its index (cuda:r in a data-parallel run on GPUs).
            self.copies.device = self.trainer.strategy.root_device
            if self._replay_follows:
                self.copies.replay_device = self.copies.device
        self.budget.world_size = self.world_size
        if self.world_size > 1:
            # The module is the same on every rank (DDP broadcasts it); exploration must not be.
            seed = self.seed + RANK_SEED_STRIDE * self.rank
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
        if self.replay is None:
            self.replay = self._new_replay()

    def _new_replay(self) -> Any:
        rollout = self.requirements.rollout
        if rollout is not None:  # on-policy: each collection is a rollout on the module's device
            return RolloutBuffer(
                self.module.prepare_rollout, rollout.epochs, rollout.minibatches, rollout.target_kl,
                self.copies, self.collect.frames_per_batch, self.requirements.sample_keys,
            )  # fmt: skip
        interleaved = self.env_cfg.num_envs > 1  # several envs write a step each per collection
        buffer = make_replay_buffer(self.replay_cfg, interleaved, self.copies)
        if not self.store_frames:
            return buffer
        return FrameReplay(
            buffer, tuple(self.observation_spec.shape[1:]), self.env_cfg.frame_stack, self.copies,
            self.replay_cfg.frame_capacity, self.observation_spec.dtype,
        )  # fmt: skip

    def teardown(self, stage: str) -> None:
        # Also after an exception: worker processes must not outlive the fit (nor the interpreter's exit).
        self.close_collector()

    def train_dataloader(self) -> ExperienceStream:
        return ExperienceStream(
            self.budget, self.ingestion, self.replay, self.copies, self.replay_cfg.batch_size,
            start=self.start_collection, stop_collection=self.close_collector, control=self,
            sync_weights=bool(self.collect.workers), set_frames=self.module.set_frames,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {
            **self.budget.state_dict(), **self.ingestion.state_dict(), "rng": persistence.rng_state(),
            "collection": self.collection_state(),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.budget.load_state_dict(state)
        self.resumed_frames = self.budget.frames
        self.ingestion.load_state_dict(state)
        persistence.set_rng_state(state["rng"])
        self._collection_state = state.get("collection")  # checkpoints before it had none
        if self.resume_replay_from is not None:
            self.load_replay(self.resume_replay_from)

    # ---------------------------------------------------------------------------- the stream's control
    def stop_now(self, local: bool) -> bool:
        """Whether to stop now: ``local``, a stop request or ``trainer.should_stop`` on any rank.

        With several ranks this is a collective (every rank calls it at the same points of the stream).
        """
        requested = self.stop_request is not None and self.stop_request()
        local = bool(local or requested or self.trainer.should_stop)
        if self.world_size > 1:
            return bool(self.trainer.strategy.reduce_boolean_decision(local, all=False))
        return local

    def aborting(self) -> bool:
        """Whether Lightning received a SIGTERM of its own (the second one of a run, see
        :mod:`rl_lightning.training.interrupt`): the run ends after the current update, unsaved."""
        return bool(self.trainer.received_sigterm)

    def end_fit(self) -> None:
        self.trainer.should_stop = True

    # ---------------------------------------------------------------------------- collection
    def start_collection(self) -> Collection:
        """A collector over new training envs (see :func:`start_collection`), which continue where the
        envs of the collection state (:meth:`collection_state`) were, if there is one that fits them."""
        self.ingestion.reset()
        saved, self._collection_state = self._collection_state, None
        if saved is not None and (self.collect.workers or len(saved["env"]["envs"]) != self.env_cfg.num_envs):
            saved = None  # the envs live in worker processes, or there are more or fewer of them now
        slices = self.replay_cfg.slice_len is not None
        next_traj_id = self._next_traj_id() if slices else 0
        if saved is not None and slices:
            # The new collector numbers its envs' first trajectories from here; the saved step that then
            # replaces its own carries the ids these trajectories had, and the next new one is the saved next.
            next_traj_id = saved["next_traj_id"] - self.env_cfg.num_envs
        self.collection = start_collection(
            self.env_cfg, self.module, self.collect, self.copies,
            # Envs that start fresh continue the seed sequence instead of replaying the first episodes.
            seed=self.seed + RANK_SEED_STRIDE * self.rank + self.frames,
            random_frames=self.budget.random_frames_left(self.collect.frames_per_batch),
            track_traj_ids=slices, next_traj_id=next_traj_id,
            remaining_frames=max(0, self.collect.total_frames - self.frames), env_calls=self._env_calls,
            frames=self.frames,
        )  # fmt: skip
        self.ingestion.traj_offset = self.collection.traj_offset
        if saved is not None:
            self._continue_collection(saved)
        return self.collection

    def collection_state(self) -> dict[str, Any] | None:
        """What the training envs' next steps draw from, as plain values: each env's state (its physics, step
        count and generators, :mod:`rl_lightning.envs.state`), the collector's carried step (the current
        observations and what ``act`` wrote), the n-step windows held back and the next trajectory id.
        ``None`` where the envs' state cannot be saved (worker processes, ``async`` envs, an env
        :mod:`rl_lightning.envs.state` cannot read): a resumed run's envs then start fresh episodes."""
        collection = self.collection
        if collection is None:
            return self._collection_state
        read = getattr(collection.env, "env_state", None)  # an env of another class (marine navigation)
        if read is None:
            return None
        env = read()
        carrier = collector_carrier(collection.collector)
        if env is None or carrier is None:
            return None
        nstep = self.ingestion.nstep
        state = {
            "env": env,
            "carrier": carrier.clone().to_dict(),
            "nstep": None if nstep is None else nstep.state_dict(),
        }
        if self.replay_cfg.slice_len is not None:
            state["next_traj_id"] = int(collection.collector.state_dict()["traj_pool"]["traj_id"])
        return state

    def _continue_collection(self, saved: dict[str, Any]) -> None:
        """Puts the saved collection state into the new collection's envs, collector and n-step windows."""
        collection = self.collection
        carrier = collector_carrier(collection.collector)
        if carrier is None:
            return
        collection.env.load_env_state(saved["env"])
        restored = TensorDict(saved["carrier"], batch_size=carrier.batch_size, device=carrier.device)
        set_collector_carrier(collection.collector, restored)
        if self.ingestion.nstep is not None and saved["nstep"] is not None:
            self.ingestion.nstep.load_state_dict(saved["nstep"])

    def close_collector(self) -> None:
        """Shuts the collector (its worker processes, its Ray actors and runtime) down, keeping its state for
        the checkpoint written next and the next collector; idempotent."""
        if self.collection is not None:
            self._collection_state = self.collection_state()
        collection, self.collection = self.collection, None
        if collection is not None:
            collection.collector.shutdown()

    def _next_traj_id(self) -> int:
        """One past the largest trajectory id in the replay buffer (0 when it holds none)."""
        if self.replay is None or len(self.replay) == 0:
            return 0
        return int(self.replay.storage[: len(self.replay)].get(TRAJ_KEY).max()) + 1

    def call_training_envs(self, method: str, **kwargs: Any) -> None:
        """Calls ``method(**kwargs)`` on every training env, now and on the envs of every later collector
        (see :func:`.collection.call_training_envs`): how a callback changes what the envs play."""
        call_training_envs(self.training_env, self.env_cfg, self.collect.workers, method, kwargs)
        self._env_calls[method] = dict(kwargs)

    # ---------------------------------------------------------------------------- persistence
    def save_replay(self, path: str) -> None:
        """Writes this rank's replay shard to the directory ``path`` (see :mod:`.persistence`)."""
        if self.replay is not None:
            rank_state = {
                **self.ingestion.state_dict(), "rng": persistence.rng_state(),
                "collection": self.collection_state(),
            }  # fmt: skip
            persistence.save_replay(self.replay, path, self.rank, self.world_size, rank_state)

    def load_replay(self, path: str) -> None:
        """Restores this rank's replay shard (and, in a data-parallel run, its random state and episodes)."""
        if self.replay is None:
            self.replay = self._new_replay()
        rank_state = persistence.load_replay(self.replay, path, self.rank, self.world_size)
        if rank_state is not None:
            self.ingestion.load_state_dict(rank_state)
            persistence.set_rng_state(rank_state["rng"])
            self._collection_state = rank_state.get("collection")
