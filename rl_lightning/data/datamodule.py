"""The experience stream: TorchRL collector -> replay buffer -> sampled batches, as a LightningDataModule.

One item of the stream is one gradient update's batch. Between items the stream collects
``frames_per_batch`` frames with the module's acting policy whenever the update-to-data ratio says so,
extends the replay buffer and, once the warm-up frames are in, yields samples. The run's budget is
``total_frames`` environment frames: the stream ends there, and so does the (single) Lightning epoch.
"""

from __future__ import annotations

import functools
import math
import random
import shutil
import warnings
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector
from torchrl.data.replay_buffers.samplers import RandomSampler

from rl_lightning.algos.base import PRIORITY_KEY, ReplayRequirements
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.ray_collect import check_ray_installed, make_ray_collector
from rl_lightning.data.replay import (
    TRAJ_KEY,
    ReplayConfig,
    make_replay_buffer,
    resolve_device,
    resolve_replay,
)
from rl_lightning.data.safety import check_replay_dir
from rl_lightning.data.slices import InterleavedSliceSampler, TrajectorySliceSampler
from rl_lightning.envs.factory import EnvConfig, make_env, make_gym_env

__all__ = ["MAX_UPDATES_PER_BATCH", "CollectConfig", "ExperienceStream", "RLDataModule", "UpdateRound"]

#: Updates per item of the experience stream (a Lightning batch); see :class:`UpdateRound`.
MAX_UPDATES_PER_BATCH = 64
#: Samplers whose draws do not depend on the updates: a round draws all its samples in one call.
_ROUND_SAMPLERS = (RandomSampler, TrajectorySliceSampler, InterleavedSliceSampler)
#: Seed offset between ranks (their envs and exploration noise); larger than any frame count of a run.
_RANK_SEED_STRIDE = 1_000_003


@dataclass
class CollectConfig:
    """What the ``collect`` node of the config holds; see the configuration reference."""

    total_frames: int = 100_000
    frames_per_batch: int = 1
    warmup_frames: int = 1_000
    updates_per_frame: float = 1.0
    warmup_burst: bool = False
    workers: int = 0
    sync_workers: bool = True
    backend: str = "local"
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if self.total_frames < 1 or self.frames_per_batch < 1:
            raise ValueError("total_frames and collect.frames_per_batch must be positive.")
        if self.workers < 0:
            raise ValueError(f"collect.workers={self.workers} must be >= 0 (0: collect in this process).")
        if self.backend not in ("local", "ray"):
            raise ValueError(f"collect.backend={self.backend!r}: choose local or ray.")
        if self.backend == "local" and self.ray_address is not None:
            raise ValueError(
                "collect.ray_address is for collect.backend=ray: set that too, or drop the address."
            )
        if self.backend == "ray":
            if self.workers < 1:
                raise ValueError(
                    "collect.backend=ray needs collect.workers >= 1: the number of Ray collectors."
                )
            check_ray_installed()
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


def _stored_keys(needs: ReplayRequirements, nstep: bool) -> tuple | None:
    """The keys the replay stores (``None``: all): ``needs.sample_keys``, ``needs.extra_keys`` and n-step's
    ``steps_to_next_obs``."""
    if needs.sample_keys is None:
        return None
    return (*needs.sample_keys, *needs.extra_keys, *(("steps_to_next_obs",) if nstep else ()))


def _missing_keys(batch: TensorDictBase, keys: Sequence[Any]) -> list[Any]:
    """Those of ``keys`` (nested keys allowed) that ``batch`` lacks."""
    present = set(batch.keys(True))
    return [k for k in keys if k not in present]


def _rows(batch: TensorDictBase, keys: Sequence[Any] | None) -> TensorDictBase:
    """``batch.select(*keys, strict=False).reshape(-1)`` (``keys=None``: every key): the entries of a
    collected ``[num_envs, T]`` batch that the replay stores, one row per frame.

    For a plain ``TensorDict`` of tensors (the local collector's batches) the result is built leaf by leaf
    from views of the leaves, where TensorDict's ``select`` and ``reshape`` check and dispatch per entry:
    14 instead of 37 us for a one-frame SAC batch on a CPU, and with ``keys=None`` (every key, TD-MPC2's
    slices) 41 instead of 70 us for a one-frame hockey batch. Anything else (lazy stacks, non-tensor
    entries) takes ``select`` and ``reshape``.
    """
    rows = None
    if type(batch) is TensorDict:
        if keys is None:
            rows = _whole_rows(batch, batch.numel(), batch.batch_dims)
        else:
            rows = _plain_rows(batch, keys)
    if rows is None:
        rows = (batch if keys is None else batch.select(*keys, strict=False)).reshape(-1)
    return rows


def _whole_rows(td: TensorDict, rows: int, lead: int) -> TensorDict | None:
    """``td.reshape(-1)`` for the leading ``lead`` dims, in one walk of views of its leaves; ``None`` where
    an entry is not a tensor or a plain ``TensorDict``."""
    entries: dict[str, Any] = {}
    for name, value in td._tensordict.items():
        if type(value) is TensorDict:
            value = _whole_rows(value, rows, lead)
            if value is None:
                return None
        elif type(value) is torch.Tensor:
            value = value.reshape(rows, *value.shape[lead:])
        else:
            return None
        entries[name] = value
    batch_size = torch.Size([rows, *td.batch_size[lead:]])  # a nested entry keeps its own dims
    return TensorDict._new_unsafe(entries, batch_size=batch_size, device=td.device)


def _plain_rows(batch: TensorDict, keys: Sequence[Any]) -> TensorDict | None:
    """:func:`_rows` from views of ``batch``'s leaves; ``None`` where a key's path meets something other
    than a plain ``TensorDict`` or a tensor."""
    rows, lead = batch.numel(), batch.batch_dims
    tree: dict[str, Any] = {}
    for key in keys:
        path = (key,) if isinstance(key, str) else key
        node: Any = batch
        for part in path:
            if type(node) is not TensorDict:  # a lazy stack or another container on the way
                return None
            node = node._tensordict.get(part)
            if node is None:
                break
        if node is None:
            continue  # absent, as select(strict=False) allows
        if type(node) is not torch.Tensor:
            return None
        branch = tree
        for part in path[:-1]:
            branch = branch.setdefault(part, {})
        branch[path[-1]] = node.reshape(rows, *node.shape[lead:])
    return _rows_td(tree, torch.Size([rows]), batch.device)


def _rows_td(tree: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> TensorDict:
    entries = {k: _rows_td(v, batch_size, device) if type(v) is dict else v for k, v in tree.items()}
    return TensorDict._new_unsafe(entries, batch_size=batch_size, device=device)


class _Policy:
    """Calls ``module.act`` at call time, so callbacks that replace ``act`` are honoured."""

    def __init__(self, module: L.LightningModule) -> None:
        self.module = module

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return self.module.act(td)


class _WorkerPolicy(torch.nn.Module):
    """The module as the policy of worker processes: each worker acts with its own copy (``module.act``).

    TorchRL sends it to the workers and keeps their copies' weights in step with this one when the stream
    calls ``update_policy_weights_()``. A worker's copy is rebuilt from the module's class, specs and
    constructor arguments and loaded with its state (:meth:`__reduce__`) rather than unpickled whole: loss
    modules hold objects that do not pickle (vmapped functions), and the optimization callbacks' wrappers
    of ``act`` belong to this process.
    """

    def __init__(self, module: L.LightningModule) -> None:
        super().__init__()
        self.module = module

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        return self.module.act(td)

    def __reduce__(self) -> tuple:
        m = self.module
        # TorchRL sends a copy whose tensors are on the meta device (the weights follow through its weight
        # sync); a copy with real tensors carries them.
        state = {k: v.detach() if v.is_meta else v.detach().cpu() for k, v in m.state_dict().items()}
        recipe = (type(m), m.observation_spec, m.action_spec, dict(m.hparams), state)
        return _rebuild_worker_policy, recipe


def _rebuild_worker_policy(
    cls: type, observation_spec: Any, action_spec: Any, hparams: dict[str, Any], state: dict[str, Any]
) -> _WorkerPolicy:
    module = cls(observation_spec=observation_spec, action_spec=action_spec, **hparams)
    # A meta state carries no values: the freshly built weights stay until TorchRL's weight sync replaces
    # them (moving the module to the meta device instead fails for TorchRL loss modules' parameter dicts).
    if not any(v.is_meta for v in state.values()):
        module.load_state_dict(state)
    return _WorkerPolicy(module)


class UpdateRound:
    """The samples of up to ``n`` consecutive updates: the training part of an item of the experience stream
    (:class:`_CollectingRound`, which sets ``n`` when it runs).

    ``training_step`` runs ``update`` on each sample and hands each output to :meth:`feedback`, which
    writes new priorities into the replay before the next sample is drawn. Grouping the updates of one
    collection into few Lightning batches pays the training loop's per-batch cost (hooks, fetcher,
    optimizer wrappers: about a millisecond on a CPU, as much as a small network's update) once per
    round instead of once per update; callbacks that act on frames lose nothing, since frames only change
    between collections. A stop request is honoured between updates (the rest stays owed).

    With uniform sampling (TorchRL's ``RandomSampler``: indices drawn with replacement, independent of
    the updates) and with the slice samplers (slices drawn with replacement, a whole number of them per
    sample) the round's ``n`` samples are drawn in one call of ``n * batch_size`` rows and split: the same
    distribution as ``n`` calls, since the buffer does not change within a round, at a fraction of the
    cost (one index draw and one gather instead of ``n``: a quarter for uniform samples, a third for
    TD-MPC2's slices with 8 envs, ``benchmarks/replay_overlap.py``). Prioritized samples are drawn one by
    one: each must see the priorities of the update before it.
    """

    def __init__(self, dm: RLDataModule, n: int) -> None:
        self.dm = dm
        self.n = n

    def __len__(self) -> int:
        return self.n

    def _samples(self) -> Iterator[TensorDictBase]:
        replay = self.dm.replay
        if self.n > 1 and type(replay.sampler) in _ROUND_SAMPLERS:
            batch_size = self.dm.replay_cfg.batch_size
            with warnings.catch_warnings():  # the buffer's batch size is the one of a single update
                warnings.filterwarnings("ignore", message="Got conflicting batch_sizes")
                rows = replay.sample(batch_size * self.n)
            yield from rows.split(batch_size)
        else:
            while True:
                yield replay.sample()

    def __iter__(self) -> Iterator[TensorDictBase]:
        dm = self.dm
        samples = self._samples()
        for _ in range(self.n):
            if dm.stop_now(False):
                dm.trainer.should_stop = True
                return
            dm.owed_updates -= 1
            dm.updates += 1
            yield next(samples)

    def feedback(self, output: TensorDictBase) -> None:
        """Applies what an update returned: new priorities (prioritized replay)."""
        priority = output.get(PRIORITY_KEY, None)
        if priority is not None:
            self.dm.update_priority(priority.get("index"), priority.get("value"))


class _CollectingRound(UpdateRound):
    """An item of the experience stream: the collections the next updates wait for, then their round; and
    again, while no callback is due, up to ``MAX_UPDATES_PER_BATCH`` updates in all.

    Inert until ``training_step`` iterates it. Lightning's fetcher takes the next item of a stream before
    the current one has been trained (it prefetches a batch to know whether the epoch ends), so an item
    made with a size would be made from updates the current item is about to do: an extra round of them,
    and an item pending in the fetcher when a checkpoint is taken, lost on resume. This item decides what
    it does when it runs: it collects until updates are owed (nothing when earlier collections still owe
    some), then does up to ``MAX_UPDATES_PER_BATCH`` of them; when the frame budget is spent or a stop is
    requested it sets ``trainer.should_stop`` and does none.

    When a round leaves updates to spare and the callbacks' next batch end is not yet due
    (:meth:`ExperienceStream.batch_end_due`), the item collects again and does that collection's round too:
    SAC's one frame and one update, 64 times per Lightning batch instead of once. The data, the random
    draws and every callback's work happen in the same order and at the same frames as with one round
    per item; only the per-batch cost of Lightning's loop (about 0.7 ms on a CPU) is paid less often.
    """

    def __init__(self, stream: ExperienceStream) -> None:
        super().__init__(stream.dm, 0)
        self.stream = stream
        self.done = 0

    def __len__(self) -> int:
        return self.done

    def __iter__(self) -> Iterator[TensorDictBase]:
        dm = self.dm
        due_frames, due_updates = self.stream.batch_end_due()
        while self.stream.collect_until_owed():
            self.n = min(dm.owed_updates, MAX_UPDATES_PER_BATCH - self.done)
            for sample in super().__iter__():
                self.done += 1
                yield sample
            if dm.owed_updates or self.done >= MAX_UPDATES_PER_BATCH or dm.trainer.should_stop:
                return  # a full item, or a stop: the rest of the round is the next item's
            if dm.frames >= min(due_frames, dm.collect.total_frames) or dm.updates >= due_updates:
                return  # a callback is due at this batch end, or the budget is spent


def _batch_end_work(
    trainer: L.Trainer,
) -> tuple[list[Callable[[L.Trainer], float]], list[Callable[[L.Trainer], float]], bool]:
    """The callbacks' ``due_frames`` and ``due_updates`` methods, and whether something acts at every batch
    end undeclared.

    A callback with a ``due_frames(trainer) -> float`` method says at which frame count its batch-end work
    is next due, one with ``due_updates(trainer) -> float`` at which update count (``math.inf``: never; it
    counts time, or batches whatever they hold). A callback or module that implements
    ``on_train_batch_start`` or ``on_train_batch_end`` without either gets every batch end, as it would
    with one collection per item.
    """

    def batch_hooks(obj: Any, base: type) -> bool:
        return any(
            getattr(type(obj), h) is not getattr(base, h)
            for h in ("on_train_batch_start", "on_train_batch_end")
        )

    callbacks = trainer.callbacks
    frames = [cb.due_frames for cb in callbacks if hasattr(cb, "due_frames")]
    updates = [cb.due_updates for cb in callbacks if hasattr(cb, "due_updates")]
    undeclared = batch_hooks(trainer.lightning_module, L.LightningModule) or any(
        batch_hooks(cb, L.Callback)
        for cb in callbacks
        if not hasattr(cb, "due_frames") and not hasattr(cb, "due_updates")
    )
    return frames, updates, undeclared


class ExperienceStream:
    """Iterable over training batches (items that collect, then do a round of updates: see
    :class:`_CollectingRound`); owned by :class:`RLDataModule`."""

    def __init__(self, dm: RLDataModule) -> None:
        self.dm = dm
        self._batches: Iterator[TensorDictBase] | None = None

    def __iter__(self) -> Iterator[UpdateRound]:
        dm = self.dm
        self._due_frames, self._due_updates, self._every_batch = _batch_end_work(dm.trainer)
        dm.collector = dm.make_collector()
        self._batches = iter(dm.collector)
        try:
            while not dm.trainer.should_stop:
                yield _CollectingRound(self)
        finally:
            self._batches = None
            dm.close_collector()

    def batch_end_due(self) -> tuple[float, float]:
        """The frame and update counts at which a batch end is next due: the smallest of the callbacks'
        ``due_frames`` and ``due_updates``; the current counts (no second collection in an item) when a
        callback or the module acts at batch ends without declaring when (see :func:`_batch_end_work`)."""
        dm = self.dm
        if self._every_batch:
            return dm.frames, dm.updates
        return (
            min((due(dm.trainer) for due in self._due_frames), default=math.inf),
            min((due(dm.trainer) for due in self._due_updates), default=math.inf),
        )

    def collect_until_owed(self) -> bool:
        """Collects until updates are owed (those granted but not yet done, also those owed when a
        checkpoint was taken, need no collection); ``False`` when the fit is to stop instead.

        The budget is in frames: it ends this epoch and the fit (max_epochs is unbounded so that a finished
        run resumed with a larger total_frames continues). A stop request (Ctrl-C, a callback) is checked
        between collections, since the warm-up grants no updates, and between updates (``UpdateRound``).
        """
        dm = self.dm
        cfg = dm.collect
        while dm.owed_updates <= 0:
            if dm.stop_now(dm.frames >= cfg.total_frames):
                dm.trainer.should_stop = True
                return False
            if cfg.workers:
                dm.collector.update_policy_weights_()
            batch = next(self._batches)
            if batch.batch_dims > 2:  # [workers, envs, T] -> [workers * envs, T]
                batch = batch.reshape(-1, batch.shape[-1])
            batch = dm.trim_to_budget(batch)
            dm.add_frames(batch)
            if dm.frames >= cfg.warmup_frames:
                dm.owed_updates += dm.updates_due(batch.numel())
        return True


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

    Data-parallel runs (DDP, ``world_size`` ranks): every rank owns its envs (seeded apart), its collector
    and its replay shard, saved as ``<ckpt>.replay/rank_<r>/`` with the rank's own RNG and episode state.
    ``frames`` counts the frames of all ranks (the ranks collect in lockstep, so it is the local count
    times ``world_size``); ``total_frames`` and ``warmup_frames`` are global, ``updates_per_frame`` is per
    rank (an update averages the gradients of ``world_size`` batches, so the replay ratio, samples drawn
    per frame collected, is the single-process one). Every stop decision is collective, so the ranks
    always stop after the same update.
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
        self._stored_keys = _stored_keys(requirements, self.nstep is not None)
        self._keys_checked = False
        self._pending_episodes: list[tuple[float, int]] = []
        self.resume_replay_from: str | None = None
        self.resumed_frames = 0  # frames at the start of this process's fit (non-zero after a resume)
        #: Returns True when a stop was requested (Ctrl-C); set by whoever runs the fit.
        self.stop_request: Callable[[], bool] | None = None
        self.rank = 0
        self.world_size = 1
        self.collector: Any = None
        #: The live collector's training env (``collect.workers=0``), ``None`` between collectors.
        self.training_env: Any = None
        self._env_calls: dict[str, dict[str, Any]] = {}
        self._traj_offset = 0  # added to the trajectory ids of local worker collectors (resumed runs)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str) -> None:
        if self.trainer is not None:
            self.rank, self.world_size = self.trainer.global_rank, self.trainer.world_size
        if self.world_size > 1:
            # The module is the same on every rank (DDP broadcasts it); exploration must not be.
            seed = self.seed + _RANK_SEED_STRIDE * self.rank
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
        if self.replay is None:
            self.replay = make_replay_buffer(self.replay_cfg, interleaved=self.env_cfg.num_envs > 1)

    def teardown(self, stage: str) -> None:
        # Also after an exception: worker processes must not outlive the fit (nor the interpreter's exit).
        self.close_collector()

    def close_collector(self) -> None:
        """Shuts the collector (its worker processes, its Ray actors and runtime) down; idempotent."""
        collector, self.collector = self.collector, None
        self.training_env = None
        if collector is not None:
            collector.shutdown()

    def call_training_envs(self, method: str, **kwargs: Any) -> None:
        """Calls ``method(**kwargs)`` on every training env, now and on the envs of every later collector.

        This is how a callback changes what the training envs play (hockey's ``set_curriculum``): the
        latest call of each method is kept and repeated on freshly built envs before their first reset.
        With no live envs the call is tried on a probe env, so a wrong one fails before the first frame.

        Raises:
            ValueError: ``collect.workers > 0``: the envs live in TorchRL's worker processes, out of reach.
            AttributeError: the env has no such method (or whatever the method raises for bad arguments).
        """
        if self.collect.workers:
            raise ValueError(
                f"collect.workers={self.collect.workers}: the training envs live in TorchRL's worker "
                f"processes, where {method}() cannot reach them; set collect.workers=0 "
                "(env.vectorization=async still steps the envs in processes of their own)."
            )
        if self.training_env is not None:
            self.training_env.call_gym_envs(method, **kwargs)
        else:
            probe = make_gym_env(self.env_cfg)
            try:
                probe.get_wrapper_attr(method)(**kwargs)
            finally:
                probe.close()
        self._env_calls[method] = dict(kwargs)

    def stop_now(self, local: bool) -> bool:
        """Whether to stop now: ``local``, a stop request or ``trainer.should_stop`` on any rank.

        With several ranks this is a collective (every rank calls it at the same points of the stream).
        """
        requested = self.stop_request is not None and self.stop_request()
        local = bool(local or requested or self.trainer.should_stop)
        if self.world_size > 1:
            return bool(self.trainer.strategy.reduce_boolean_decision(local, all=False))
        return local

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
        self._set_rng(state["rng"])
        if self.resume_replay_from is not None:
            self.load_replay(self.resume_replay_from)

    # ------------------------------------------------------------------ replay persistence
    def _shard(self, path: Path) -> Path:
        return path / f"rank_{self.rank}" if self.world_size > 1 else path

    def _rank_state(self) -> dict[str, Any]:
        """What differs between ranks: RNG streams and the episodes seen (saved beside the rank's shard)."""
        state = self.state_dict()
        return {k: state[k] for k in ("episodes", "recent_returns", "rng")}

    def save_replay(self, path: str | Path) -> None:
        """Writes the replay buffer (this rank's shard) to the directory ``path`` (atomically replaced)."""
        if self.replay is None:
            return
        target = self._shard(Path(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        self.replay.dumps(tmp)
        if self.world_size > 1:
            torch.save(self._rank_state(), tmp / "rank_state.pt")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)

    def load_replay(self, path: str | Path) -> None:
        """Restores the replay buffer (this rank's shard, and its rank state) written by :meth:`save_replay`.

        Raises:
            FileNotFoundError: when the directory is missing (the checkpoint was saved without it).
            UnsafeFileError: the directory holds something loading would have to run (see
                :func:`rl_lightning.data.safety.check_replay_dir`).
            ValueError: the checkpoint was written by a different number of ranks.
        """
        path = Path(path)
        check_replay_dir(path)  # nothing of it is read before it passed
        shards = sorted(p.name for p in path.glob("rank_*") if p.is_dir())
        if len(shards) != (self.world_size if self.world_size > 1 else 0):
            written = f"{len(shards)} ranks" if shards else "one process"
            raise ValueError(
                f"{path} was written by {written}; resume it with trainer.devices={max(1, len(shards))} "
                f"(and as many nodes), not {self.world_size}."
            )
        shard = self._shard(path)
        if self.replay is None:
            self.replay = make_replay_buffer(self.replay_cfg, interleaved=self.env_cfg.num_envs > 1)
        self.replay.loads(shard)
        if self.world_size > 1:
            state = torch.load(shard / "rank_state.pt", weights_only=True)
            self.episodes = int(state["episodes"])
            self.recent_returns.clear()
            self.recent_returns.extend(state["recent_returns"])
            self._set_rng(state["rng"])

    def _set_rng(self, rng: dict[str, Any]) -> None:
        torch.set_rng_state(rng["torch"])
        np.random.set_state(_numpy_state_from_plain(rng["numpy"]))
        random.setstate(rng["python"])

    # ------------------------------------------------------------------ the stream's work
    def make_collector(self) -> Collector | MultiSyncCollector | MultiAsyncCollector:
        """A TorchRL collector over fresh training envs, acting with ``module.act``.

        ``collect.workers=0``: a ``Collector`` in this process (envs stepped here, ``env.vectorization``
        decides how). ``collect.workers=W``: TorchRL's ``MultiSyncCollector`` (``sync_workers``, every
        worker contributes to each batch) or ``MultiAsyncCollector`` (the first ready worker's batch) over
        ``W`` processes that each step ``env.num_envs`` envs and act with their own copy of the module,
        whose weights the stream refreshes before every collection. ``collect.backend=ray``: the same
        over ``W`` Ray actors, with TorchRL's ``RayCollector`` (:mod:`rl_lightning.data.ray_collect`).

        The local collector storing on the CPU yields the same buffers every time (``return_same_td``):
        ``add_frames`` copies each batch into the replay buffer before the next collection overwrites it,
        so TorchRL's copy of every batch (about 0.1 ms of a one-frame SAC collection) is skipped.
        """
        module = self.trainer.lightning_module
        self._traj_offset = 0
        if self.nstep is not None:
            self.nstep.reset()
        # A resumed run continues the seed sequence instead of replaying its first episodes.
        seed = self.seed + _RANK_SEED_STRIDE * self.rank + self.frames
        storing = resolve_device(self.replay_cfg.device)
        common = {
            "total_frames": -1,
            "init_random_frames": self._random_frames_left(),
            "storing_device": storing,
            "env_device": "cpu",
            "policy_device": module.device,
            "trust_policy": True,
        }
        workers = self.collect.workers
        if workers:
            # Each worker's envs get their own seeds: worker w steps envs seed + w * num_envs + i.
            makers = [
                functools.partial(make_env, self.env_cfg, None, seed + w * self.env_cfg.num_envs)
                for w in range(workers)
            ]
            per_worker = max(1, self.collect.frames_per_batch // workers)
            # Every worker counts its own random warm-up frames: give each its share.
            random_left = common.pop("init_random_frames") or 0
            per_worker_random = math.ceil(random_left / workers)
            random_share = math.ceil(per_worker_random / per_worker) * per_worker or None
            if self.collect.backend == "ray":
                return make_ray_collector(
                    makers,
                    _WorkerPolicy(module),
                    frames_per_worker=per_worker,
                    sync=self.collect.sync_workers,
                    random_frames_per_worker=random_share or 0,
                    address=self.collect.ray_address,
                    traj_start=self._next_traj_id() if self.replay_cfg.slice_len is not None else None,
                    num_envs=self.env_cfg.num_envs,
                    remaining_frames=max(0, self.collect.total_frames - self.frames),
                )
            cls = MultiSyncCollector if self.collect.sync_workers else MultiAsyncCollector
            per_batch = self.collect.frames_per_batch if cls is MultiSyncCollector else per_worker
            # The workers number their trajectories from 0 (apart from each other): a resumed run shifts
            # them past the ids already in the buffer as they arrive (add_frames).
            self._traj_offset = self._next_traj_id()
            return cls(
                makers,
                _WorkerPolicy(module),
                frames_per_batch=per_batch,
                init_random_frames=random_share,
                **common,
            )
        env = make_env(self.env_cfg, seed=seed)
        for method, kwargs in self._env_calls.items():  # before the collector's first reset
            env.call_gym_envs(method, **kwargs)
        self.training_env = env
        collector = Collector(
            env,
            _Policy(module),
            frames_per_batch=self.collect.frames_per_batch,
            track_traj_ids=self.replay_cfg.slice_len is not None,
            return_same_td=storing.type == "cpu",
            **common,
        )
        if self._stored_keys is not None:
            # The collector strips private ("_"-prefixed) keys from every batch by walking all its keys
            # (about a tenth of a one-frame collection); ``add_frames`` stores named keys only, so none
            # could reach the replay, and nothing else reads them.
            collector._exclude_private_keys = False
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
        left = -(-max(0, self.collect.warmup_frames - self.frames) // self.world_size)  # this rank's share
        fpb = self.collect.frames_per_batch
        return -(-left // fpb) * fpb or None

    def trim_to_budget(self, batch: TensorDictBase) -> TensorDictBase:
        """Drops the time steps of a collected ``[num_envs, T]`` batch past ``total_frames``.

        The run then ends at exactly ``total_frames`` frames when the number of envs divides it (else at
        the next multiple of it), whatever ``frames_per_batch``.
        """
        left = -(-(self.collect.total_frames - self.frames) // self.world_size)  # this rank's share
        if batch.numel() <= left:
            return batch
        n_envs = batch.shape[0] if batch.batch_dims > 1 else 1
        steps = -(-left // n_envs)
        return batch[..., :steps]

    def add_frames(self, batch: TensorDictBase) -> None:
        """Counts a collected batch ``[num_envs, T]``, records finished episodes and extends the buffer."""
        if self.requirements.extra_keys and self.frames >= self.collect.warmup_frames:
            missing = _missing_keys(batch, self.requirements.extra_keys)
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
        if self._traj_offset and TRAJ_KEY in batch.keys(True):
            batch = batch.copy()  # a new entry, not a write into the collector's own buffers
            batch.set(TRAJ_KEY, batch.get(TRAJ_KEY) + self._traj_offset)
        if self.nstep is not None:
            batch = self.nstep(batch)
        if self._stored_keys is not None and not self._keys_checked:
            self._check_sample_keys(batch)
        # Extra keys are absent from random warm-up frames (no act wrote them): kept where present.
        self.replay.extend(_rows(batch, self._stored_keys))
        self.frames += done.numel() * self.world_size  # the ranks collect in lockstep
        module = self.trainer.lightning_module
        if hasattr(module, "set_frames"):
            module.set_frames(self.frames)

    def _check_sample_keys(self, batch: TensorDictBase) -> None:
        missing = _missing_keys(batch, self.requirements.sample_keys or ())
        if missing:
            raise KeyError(
                f"the algorithm's replay_requirements().sample_keys name {missing}, which the collected data "
                "lacks; declare only keys the env or act writes (sample_keys=None stores everything)."
            )
        self._keys_checked = True

    def updates_due(self, new_frames: int) -> int:
        """How many updates the update-to-data ratio grants for ``new_frames`` new frames.

        With ``collect.warmup_burst``, the first grant after the warm-up is TD-MPC2's seeding burst: one
        update per warm-up frame (this rank's share), whatever ``updates_per_frame``, as the reference
        trainer runs ``seed_steps`` updates when seeding ends; the ratio applies only to the frames of that
        collection past the warm-up, and to every later collection.
        """
        ratio = self.collect.updates_per_frame
        if self.collect.warmup_burst and not self._burst_done:
            self._burst_done = True
            warmup = self.collect.warmup_frames
            share = warmup / self.world_size  # this rank's warm-up frames
            past = min(new_frames, max(0, self.frames - warmup) / self.world_size)
            self._update_credit += share + past * ratio
        else:
            self._update_credit += new_frames * ratio
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
