"""Collection: the TorchRL collector of a run's training envs, built from explicit arguments.

In this process (``collect.workers=0``) the collector steps the envs on the host and calls the policy there
too: :class:`Policy` moves the observations to the module's device and the actions back through the run's
device copies, so every host/device copy of acting goes through one switch. With ``collect.workers=W`` the
envs and a copy of the module live in ``W`` TorchRL worker processes (or Ray actors); the collectors'
device arguments come from the device copies (:meth:`.DeviceCopies.collector_devices`): the batches stay
on the host and cross to the replay through the switch, and only a worker's own copies for its copy of the
module (observations to the module's device, actions back) are TorchRL's, in the worker process. This
process keeps the workers' weights in step.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.collectors import Collector, MultiAsyncCollector, MultiSyncCollector

from rl_lightning.compat import skip_private_key_filter
from rl_lightning.data.ray_collect import check_ray_installed, make_ray_collector
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.agents import act_rows, agent_group
from rl_lightning.envs.factory import EnvConfig, make_env, make_gym_env

__all__ = [
    "CollectConfig",
    "Collection",
    "Policy",
    "WorkerPolicy",
    "call_training_envs",
    "start_collection",
    "unobserved",
]


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


class Policy:
    """The collector's policy in this process: ``module.act``, looked up at call time (so callbacks that
    replace ``act`` are honoured), on the module's device; the observations go there and what ``act``
    writes (the action, an option index) comes back through ``copies``. With an agent ``group`` (several
    agents per env) ``act`` runs once per step on every agent as a row
    (:func:`~rl_lightning.envs.agents.act_rows`).

    What ``act`` wrote is every entry it set, new or not: the collector hands the policy the same
    TensorDict at every step, which already holds the previous step's action.
    """

    def __init__(self, module: torch.nn.Module, copies: DeviceCopies, group: str | None = None) -> None:
        self.module = module
        self.copies = copies
        self.group = group

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return act_rows(self._act, td, self.group)

    def _act(self, td: TensorDictBase) -> TensorDictBase:
        moved = self.copies.to_policy(td)
        if moved is td:
            return self.module.act(td)
        before = {key: moved.get(key) for key in moved.keys(True, True)}
        out = self.module.act(moved)
        for key in out.keys(True, True):
            value = out.get(key)
            if before.get(key) is not value:  # set by act (an entry it did not touch is the same tensor)
                td.set(key, self.copies.to_env(value))
        return td


class WorkerPolicy(torch.nn.Module):
    """The module as the policy of worker processes: each worker acts with its own copy (``module.act``).

    TorchRL sends it to the workers and keeps their copies' weights in step with this one when the stream
    calls ``update_policy_weights_()``. A worker's copy is rebuilt from the module's class, specs and
    constructor arguments and loaded with its state (:meth:`__reduce__`) rather than unpickled whole: loss
    modules hold objects that do not pickle (vmapped functions), and the optimization callbacks' wrappers
    of ``act`` belong to this process.
    """

    def __init__(self, module: torch.nn.Module) -> None:
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
) -> WorkerPolicy:
    module = cls(observation_spec=observation_spec, action_spec=action_spec, **hparams)
    # A meta state carries no values: the freshly built weights stay until TorchRL's weight sync replaces
    # them (moving the module to the meta device instead fails for TorchRL loss modules' parameter dicts).
    if not any(v.is_meta for v in state.values()):
        module.load_state_dict(state)
    return WorkerPolicy(module)


@contextlib.contextmanager
def unobserved(module: torch.nn.Module) -> Iterator[None]:
    """Whatever ``module.act`` does inside leaves no trace: its random draws and its buffers are set back.

    TorchRL's collector calls its policy once on a made-up step to size its buffers. ``act`` would draw
    random numbers there (shifting the run's random streams at every collector start, so that a resumed run,
    which starts a collector the uninterrupted run did not, would draw other numbers) and write per-env
    state (a warm-start plan, the active option) from that step.
    """
    devices = [module.device] if module.device.type == "cuda" else []
    buffers = [(b, b.clone()) for b in module.buffers()]
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        yield
        for buffer, saved in buffers:
            buffer.copy_(saved)


@dataclass
class Collection:
    """A live collector and what the data path needs to know of it."""

    collector: Any
    #: The training env of a collector in this process (``None`` with workers): callbacks call it.
    env: Any = None
    #: Added to the trajectory ids the collector writes (local workers number theirs from 0).
    traj_offset: int = 0


def start_collection(
    env_cfg: EnvConfig,
    module: torch.nn.Module,
    cfg: CollectConfig,
    copies: DeviceCopies,
    *,
    seed: int,
    random_frames: int | None,
    track_traj_ids: bool,
    next_traj_id: int,
    remaining_frames: int,
    env_calls: dict[str, dict[str, Any]],
    frames: int = 0,
) -> Collection:
    """A TorchRL collector over fresh training envs, acting with ``module.act``.

    ``collect.workers=0``: a ``Collector`` in this process; the envs, the collector's buffers and the random
    warm-up actions stay on the host (``env.vectorization`` decides how the envs step), and
    :class:`Policy` crosses to the module's device. Its batches are the same buffers every time
    (``return_same_td``): the data path copies each into the replay before the next collection overwrites it.
    ``collect.workers=W``: TorchRL's ``MultiSyncCollector`` (``sync_workers``, every worker contributes to
    each batch) or ``MultiAsyncCollector`` (the first ready worker's batch) over ``W`` processes that each
    step ``env.num_envs`` envs and act with their own copy of the module on its device.
    ``collect.backend=ray``: the same over ``W`` Ray actors (:mod:`rl_lightning.data.ray_collect`).

    Args:
        env_cfg: the training envs' config.
        module: the algorithm (its ``act`` is the policy).
        cfg: the collection settings.
        copies: the run's device copies.
        seed: the first env's seed (env ``i`` gets ``seed + i``; worker ``w``'s envs follow on).
        random_frames: random-action frames still to collect (a multiple of ``frames_per_batch``), or None.
        track_traj_ids: write trajectory ids (slice sampling needs them).
        next_traj_id: the first trajectory id not in the replay yet (a resumed run's new ones follow on).
        remaining_frames: frames left in the budget (bounds a Ray actor's trajectory ids).
        env_calls: methods to call on fresh training envs before their first reset, with their arguments.
        frames: env frames collected before this collection (an env whose curriculum follows frames
            continues from there).
    """
    workers = cfg.workers
    if not workers:
        env = make_env(env_cfg, seed=seed, train=True, frames=frames)
        for method, kwargs in env_calls.items():  # before the collector's first reset
            env.call_gym_envs(method, **kwargs)
        with unobserved(module):  # the collector's probe of the policy leaves no trace
            policy = Policy(module, copies, agent_group(env))
            collector = Collector(
                env, policy, frames_per_batch=cfg.frames_per_batch, total_frames=-1,
                init_random_frames=random_frames, **copies.collector_devices(policy_in_workers=False),
                trust_policy=True, track_traj_ids=track_traj_ids, return_same_td=True,
            )  # fmt: skip
        # The data path stores named keys only, so the private ("_"-prefixed) ones need no filtering.
        skip_private_key_filter(collector)
        if next_traj_id:
            # A resumed run's trajectories must not reuse the ids of those in the buffer: the sequence
            # sampler would join a new trajectory to an old one with the same id.
            pool = {"traj_id": torch.tensor(next_traj_id, dtype=torch.int)}
            collector.load_state_dict({"frames": 0, "iter": 0, "traj_pool": pool}, strict=False)
        return Collection(collector, env=env)
    # Each worker's envs get their own seeds: worker w steps envs seed + w * num_envs + i.
    makers = [
        functools.partial(make_env, env_cfg, None, seed + w * env_cfg.num_envs, train=True)
        for w in range(workers)
    ]
    per_worker = max(1, cfg.frames_per_batch // workers)
    # Every worker counts its own random warm-up frames: give each its share.
    per_worker_random = math.ceil((random_frames or 0) / workers)
    random_share = math.ceil(per_worker_random / per_worker) * per_worker or None
    if cfg.backend == "ray":
        collector = make_ray_collector(
            makers, WorkerPolicy(module), frames_per_worker=per_worker, sync=cfg.sync_workers,
            random_frames_per_worker=random_share or 0, address=cfg.ray_address,
            traj_start=next_traj_id if track_traj_ids else None, num_envs=env_cfg.num_envs,
            remaining_frames=remaining_frames, devices=copies.collector_devices(policy_in_workers=False),
        )  # fmt: skip
        return Collection(collector)
    cls = MultiSyncCollector if cfg.sync_workers else MultiAsyncCollector
    collector = cls(
        makers, WorkerPolicy(module), init_random_frames=random_share, total_frames=-1,
        frames_per_batch=cfg.frames_per_batch if cfg.sync_workers else per_worker,
        **copies.collector_devices(policy_in_workers=True), trust_policy=True,
    )  # fmt: skip
    # The workers number their trajectories from 0 (apart from each other): the data path shifts them past
    # the ids already in the buffer as they arrive.
    return Collection(collector, traj_offset=next_traj_id)


def call_training_envs(
    env: Any, env_cfg: EnvConfig, workers: int, method: str, kwargs: dict[str, Any]
) -> None:
    """Calls ``method(**kwargs)`` on every env of a live collection's training ``env`` (``None``: none is
    live; the call is tried on a probe env, so a wrong one fails before the first frame). The data module
    keeps the latest call of each method and repeats it on the envs of every later collection before their
    first reset (hockey's ``set_curriculum``).

    Raises:
        ValueError: ``workers > 0``: the envs live in TorchRL's worker processes, out of reach.
        AttributeError: the env has no such method (or whatever the method raises for bad arguments).
    """
    if workers:
        raise ValueError(
            f"collect.workers={workers}: the training envs live in TorchRL's worker processes, where "
            f"{method}() cannot reach them; set collect.workers=0 (env.vectorization=async still steps the "
            "envs in processes of their own)."
        )
    if env is not None:
        env.call_gym_envs(method, **kwargs)
        return
    probe = make_gym_env(env_cfg)
    try:
        probe.get_wrapper_attr(method)(**kwargs)
    finally:
        probe.close()
