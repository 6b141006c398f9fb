"""Environment factory: a gymnasium id and a few options -> a batched TorchRL environment."""

from __future__ import annotations

import difflib
import functools
import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
from torchrl.envs import EnvBase

from rl_lightning.envs.agents import AGENTS
from rl_lightning.envs.hockey import register_envs
from rl_lightning.envs.images import (
    PREPROCESSING,
    check_image_env_available,
    preprocess,
    register_image_envs,
)
from rl_lightning.envs.marinenav import gym_env_kwargs, make_marinenav_env
from rl_lightning.envs.vector import GymVecEnv

__all__ = [
    "BATCHED_ENVS", "BatchedEnv", "EnvConfig", "UnknownEnvError", "agent_group_of", "check_env_id",
    "check_spaces", "env_modules", "import_env_packages", "make_env", "make_gym_env",
]  # fmt: skip


class UnknownEnvError(ValueError):
    """Raised for a gymnasium id that is not registered."""


@dataclass
class EnvConfig:
    """What ``conf/env/*.yaml`` holds; see the configuration reference.

    Attributes:
        id: gymnasium id, for example ``CartPole-v1`` or ``HockeyVsOpponent-v0``.
        num_envs: parallel training envs; the policy acts on all of them in one batched call.
        vectorization: ``sync`` (one process) or ``async`` (a worker process per env).
        max_episode_steps: episode length limit; ``None`` keeps the id's own.
        kwargs: keyword arguments for ``gymnasium.make``.
        info_keys: numeric ``info`` entries copied into the collected data (for example ``winner``).
        eval_num_envs: envs used side by side for evaluation.
        preprocess: ``atari`` or ``minatar``: the protocol's wrappers (:mod:`rl_lightning.envs.images`);
            ``None``: the env as gymnasium makes it.
        frame_stack: the last this many observations stacked along the first axis (gymnasium's
            ``FrameStackObservation``, the first observation repeated at an episode's start); 1: none.
        reward_clip: training envs see rewards clipped to their sign (evaluation and the logged episode
            returns keep the env's own).
        packages: modules imported before the env is made, which register ids of their own (the RL zoo's
            ``--gym-packages``); an ``id`` of gymnasium's form ``module:Id`` imports ``module`` itself.
    """

    id: str
    num_envs: int = 1
    vectorization: str = "sync"
    max_episode_steps: int | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    info_keys: Sequence[str] = ()
    eval_num_envs: int = 1
    preprocess: str | None = None
    frame_stack: int = 1
    reward_clip: bool = False
    packages: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.preprocess is not None and self.preprocess not in PREPROCESSING:
            raise ValueError(f"env.preprocess={self.preprocess!r}: use one of {list(PREPROCESSING)} or null.")
        if self.frame_stack < 1:
            raise ValueError(f"env.frame_stack={self.frame_stack} must be >= 1 (1: no stacking).")

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> EnvConfig:
        """Builds the config from a mapping (a Hydra node converted to a container)."""
        allowed = set(cls.__dataclass_fields__)
        unknown = set(cfg) - allowed
        if unknown:
            raise ValueError(f"Unknown env option(s) {sorted(unknown)}; allowed: {sorted(allowed)}.")
        return cls(**dict(cfg))


@dataclass(frozen=True)
class BatchedEnv:
    """An id whose training and evaluation envs are one TorchRL env that batches its envs itself.

    Attributes:
        build: ``build(kwargs, num_envs, train=..., frames=...)``: the env config's ``kwargs``, the number of
            envs, whether they are a run's training envs, and the env steps the run's earlier training
            envs took (a curriculum over frames continues from there after a resume).
        agent_group: the env's agent group (several agents per env acting through one policy), or ``None``.
        gym_kwargs: the keywords of the id's gymnasium env (one env, to render) for the env config's
            ``kwargs``, where they differ; ``None``: the same.
    """

    build: Callable[..., EnvBase]
    agent_group: str | None = None
    gym_kwargs: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None


#: Ids built by a batched env of their own instead of :class:`GymVecEnv` over gymnasium copies: marine
#: navigation steps every robot of every env with array operations and lays robots out as an agent group.
BATCHED_ENVS: dict[str, BatchedEnv] = {
    "MarineNav-v0": BatchedEnv(
        functools.partial(make_marinenav_env, continuous=False), AGENTS, gym_env_kwargs
    ),
    "MarineNavContinuous-v0": BatchedEnv(
        functools.partial(make_marinenav_env, continuous=True), AGENTS, gym_env_kwargs
    ),
}


def agent_group_of(cfg: EnvConfig) -> str | None:
    """The agent group of ``cfg``'s env (``None``: one agent per env)."""
    batched = BATCHED_ENVS.get(cfg.id)
    return None if batched is None else batched.agent_group


def _check_batched(cfg: EnvConfig) -> None:
    """Refuses the env options a batched env does not honour, with what to change."""
    refused = {
        "vectorization": (cfg.vectorization, "sync"),
        "max_episode_steps": (cfg.max_episode_steps, None),
        "info_keys": (list(cfg.info_keys), []),
        "preprocess": (cfg.preprocess, None),
        "frame_stack": (cfg.frame_stack, 1),
        "reward_clip": (cfg.reward_clip, False),
    }
    for name, (value, default) in refused.items():
        if value != default:
            raise ValueError(
                f"env.{name}={value}: {cfg.id} batches its envs itself and does not take it; set env.{name}="
                f"{'null' if default is None else default}."
            )


def env_modules(cfg: EnvConfig) -> list[str]:
    """The modules making ``cfg``'s env imports: its ``packages`` and the module of a ``module:Id`` id."""
    module = cfg.id.partition(":")[0] if ":" in cfg.id else None
    return [*cfg.packages, *([module] if module else [])]


def import_env_packages(packages: Sequence[str]) -> None:
    """Imports each of ``packages`` (their import registers their ids); one line naming what failed."""
    for name in packages:
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise UnknownEnvError(
                f"cannot import env package '{name}' ({err}); put it on the Python path (the directory you "
                "run from is) or install it."
            ) from None


def check_env_id(env_id: str, packages: Sequence[str] = ()) -> None:
    """Raises :class:`UnknownEnvError` with close matches when ``env_id`` is not registered, after
    importing ``packages`` and, for gymnasium's ``module:Id`` form, ``module``."""
    register_envs()  # our own ids (idempotent)
    import_env_packages(packages)
    module, _, bare = env_id.rpartition(":")
    if module:
        import_env_packages([module])
    register_image_envs(bare)
    if bare in gym.registry:
        return
    check_image_env_available(bare)
    close = difflib.get_close_matches(bare, list(gym.registry), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    where = f" Module '{module}' registers no such id." if module else ""
    raise UnknownEnvError(
        f"Unknown gymnasium id '{bare}'.{where}{hint} Set env.id to a registered id, or to module:Id for an "
        "env your own module registers (env.packages=[module] imports such modules first)."
    )


def check_spaces(cfg: EnvConfig) -> None:
    """Runs gymnasium's env checker once on one env of ``cfg`` (its spaces, reset and step against them);
    a mismatch is one line naming the problem."""
    from gymnasium.utils.env_checker import check_env

    env = make_gym_env(cfg)
    try:
        check_env(env.unwrapped, skip_render_check=True)
    except AssertionError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UnknownEnvError(f"env.id={cfg.id} fails gymnasium's env checker: {first}") from None
    finally:
        env.close()


def _env_fn(cfg: EnvConfig) -> Callable[[], gym.Env]:
    kwargs = dict(cfg.kwargs)
    batched = BATCHED_ENVS.get(cfg.id)
    if batched is not None and batched.gym_kwargs is not None:
        kwargs = batched.gym_kwargs(kwargs)
    if cfg.max_episode_steps is not None:
        kwargs["max_episode_steps"] = cfg.max_episode_steps

    def build() -> gym.Env:
        register_envs()  # worker processes register our ids too
        import_env_packages(cfg.packages)  # and import the user's env packages
        register_image_envs(cfg.id)
        # The passive checker costs a little on every step and is meant for env authors.
        env = preprocess(cfg.preprocess, cfg.id, kwargs)
        if cfg.frame_stack > 1:
            env = gym.wrappers.FrameStackObservation(env, cfg.frame_stack)
            stacked = env.observation_space.shape
            if len(stacked) == 4:  # [k, C, H, W] frames -> [k * C, H, W] channels, as a CNN reads them
                env = gym.wrappers.ReshapeObservation(env, (stacked[0] * stacked[1], *stacked[2:]))
        return env

    return build


def make_gym_env(cfg: EnvConfig) -> gym.Env:
    """One plain gymnasium env of ``cfg`` (for rendering; training and evaluation use :func:`make_env`)."""
    check_env_id(cfg.id, cfg.packages)
    return _env_fn(cfg)()


def make_env(
    cfg: EnvConfig, num_envs: int | None = None, seed: int | None = None, train: bool = False, frames: int = 0
) -> EnvBase:
    """Builds the batched TorchRL env described by ``cfg``.

    Args:
        cfg: the env config.
        num_envs: overrides ``cfg.num_envs`` (evaluation uses ``cfg.eval_num_envs``).
        seed: seeds every env (env ``i`` gets ``seed + i``) and its action space.
        train: the training envs of a run: rewards clipped with ``cfg.reward_clip`` (never for evaluation).
        frames: env steps the run took before these training envs: an env of :data:`BATCHED_ENVS` whose
            curriculum follows frames continues from there (a resumed run); the others have no use for it.
    """
    check_env_id(cfg.id, cfg.packages)
    n = cfg.num_envs if num_envs is None else num_envs
    batched = BATCHED_ENVS.get(cfg.id)
    if batched is not None:
        _check_batched(cfg)
        env = batched.build(cfg.kwargs, n, train=train, frames=frames)
        if seed is not None:
            env.set_seed(seed)
        return env
    env = GymVecEnv(
        [_env_fn(cfg)] * n,
        vectorization=cfg.vectorization,
        info_keys=cfg.info_keys,
        reward_clip=train and cfg.reward_clip,
    )
    if seed is not None:
        env.set_seed(seed)
    return env
