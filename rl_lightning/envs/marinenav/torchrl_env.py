"""Marine navigation as one batched TorchRL env: ``E`` envs of up to ``R`` robots, robots as an agent group.

The training and evaluation envs of a run (``make_env`` builds it for the marine-navigation ids): one
:class:`~rl_lightning.envs.marinenav.core.MarineNavBatch` steps every robot of every env with array
operations, and the data is laid out as TorchRL's multi-agent envs lay it out
(:mod:`rl_lightning.envs.agents`).

Keys (batch ``[E]``; the group ``agents`` has batch ``[E, R]``):

- root: ``("agents", "observation") [E, R, 37]`` float32, ``("agents", "mask") [E, R]`` (the robot is active:
  it acts in this step and its transition counts), ``episode_reward [E, 1]`` (the running sum over robots),
  ``step_count [E, 1]``, ``done``/``terminated``/``truncated [E, 1]``;
- action: ``("agents", "action")``: ``[E, R]`` int64 in ``[0, 25)`` or ``[E, R, 2]`` in ``[-1, 1]``;
- ``next``: the group's ``observation``, ``mask`` (active after the step), ``reward [E, R, 1]`` and per-robot
  ``terminated`` (collided or reached its goal), ``truncated`` (running when the episode ended otherwise:
  the timeout, or another robot's collision under the evaluation rule), ``done``; env-level ``done``,
  ``terminated`` (every robot stopped, or a collision under the evaluation rule), ``truncated`` (the
  timeout), ``episode_reward``, ``step_count``; and the episode's outcome in the public evaluation's terms
  (float32 ``[E, 1]``, meaningful where ``done``): ``success`` (every robot reached its goal),
  ``collision`` (some robot collided), ``timeout`` (neither), ``travel_time``, ``energy`` and
  ``path_length`` (means over the episode's robots).

An env whose episode ended is reset inside the step (as :class:`~rl_lightning.envs.vector.GymVecEnv` does),
alone: the others go on. Training envs draw each episode's level from the curriculum at the env steps
taken so far (all envs together, so a run's frames index the schedule, as the public trainer's one env's
steps do); evaluation envs take the schedule's levels in turn, the public evaluation's scenario mix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from rl_lightning.envs.agents import AGENTS, MASK_KEY
from rl_lightning.envs.marinenav import constants as C
from rl_lightning.envs.marinenav.core import MarineNavBatch
from rl_lightning.envs.marinenav.env import resolve_levels

__all__ = ["OUTCOME_KEYS", "MarineNavVecEnv", "gym_env_kwargs", "make_marinenav_env"]

#: Episode figures written into ``next`` (float32 ``[E, 1]``), meaningful at an episode's last step.
OUTCOME_KEYS = ("success", "collision", "timeout", "travel_time", "energy", "path_length")


def _bool(shape: tuple[int, ...]) -> Categorical:
    return Categorical(2, shape=shape, dtype=torch.bool)


class MarineNavVecEnv(EnvBase):
    """``num_envs`` marine-navigation envs as one TorchRL env with a robot group (see the module docstring).

    Args:
        num_envs: envs side by side (E).
        continuous: ``[-1, 1]²`` thrust changes per robot instead of 25 discrete ones.
        schedule, num_robots, num_cores, num_obstacles, min_start_goal_dis, max_robots: the levels, as
            :class:`~rl_lightning.envs.marinenav.env.MarineNavEnv` takes them (default: the paper's
            curriculum).
        perception_noise: the public env's noisy perception.
        train: training envs follow the curriculum by steps; evaluation envs take its levels in turn.
        eval_end_on_collision: evaluation envs end an episode at its first collision (the public
            evaluation's rule); training envs always play on until every robot stopped (the public trainer's).
        frames: env steps already taken by a run's earlier training envs (a resumed run's curriculum).
    """

    agent_group = AGENTS

    def __init__(
        self,
        num_envs: int,
        *,
        continuous: bool = False,
        schedule: str | dict | C.Schedule | None = "paper",
        num_robots: int | None = None,
        num_cores: int | None = None,
        num_obstacles: int | None = None,
        min_start_goal_dis: float | None = None,
        max_robots: int | None = None,
        perception_noise: bool = True,
        train: bool = True,
        eval_end_on_collision: bool = True,
        frames: int = 0,
    ) -> None:
        if num_envs < 1:
            raise ValueError("num_envs must be at least 1.")
        super().__init__(batch_size=torch.Size([num_envs]), device="cpu")
        self.schedule, self.fixed_level, R = resolve_levels(
            schedule, num_robots, num_cores, num_obstacles, min_start_goal_dis, max_robots
        )
        self.levels = self.schedule.levels if self.schedule is not None else (self.fixed_level,)
        self.train, self.frames = train, int(frames)
        E = num_envs
        self.sim = MarineNavBatch(
            E, R, max(lv.num_obstacles for lv in self.levels), max(lv.num_cores for lv in self.levels),
            continuous=continuous, perception_noise=perception_noise,
            end_on_collision=not train and eval_end_on_collision,
        )  # fmt: skip
        self.continuous = continuous
        self.num_robots = R
        self._episodes = np.zeros(E, dtype=np.int64)  # episodes started per env (evaluation's level turn)
        agents = Composite(
            observation=Unbounded((E, R, C.OBS_DIM), dtype=torch.float32), mask=_bool((E, R)), shape=(E, R)
        )
        self.observation_spec = Composite(
            agents=agents,
            episode_reward=Unbounded((E, 1), dtype=torch.float32),
            step_count=Unbounded((E, 1), dtype=torch.int64),
            **{k: Unbounded((E, 1), dtype=torch.float32) for k in OUTCOME_KEYS},
            shape=(E,),
        )
        if continuous:
            action: Any = Bounded(-1.0, 1.0, shape=(E, R, 2), dtype=torch.float32)
        else:
            action = Categorical(C.N_DISCRETE_ACTIONS, shape=(E, R), dtype=torch.int64)
        self.full_action_spec = Composite(agents=Composite(action=action, shape=(E, R)), shape=(E,))
        reward = Composite(reward=Unbounded((E, R, 1), dtype=torch.float32), shape=(E, R))
        self.full_reward_spec = Composite(agents=reward, shape=(E,))
        ends = {k: _bool((E, R, 1)) for k in ("done", "terminated", "truncated")}
        self.full_done_spec = Composite(
            agents=Composite(**ends, shape=(E, R)),
            **{k: _bool((E, 1)) for k in ("done", "terminated", "truncated")},
            shape=(E,),
        )
        self._return = np.zeros((E, 1), np.float32)
        self._length = np.zeros((E, 1), np.int64)
        self._obs = np.zeros((E, R, C.OBS_DIM), np.float32)

    # ------------------------------------------------------------------ episodes
    def _level(self, i: int) -> C.Level:
        if self.schedule is None:
            return self.fixed_level  # type: ignore[return-value]
        if self.train:
            return self.levels[self.schedule.level_index(self.frames)]
        # Evaluation: the levels in turn over the envs' episodes (env i's k-th episode: level (kE + i) % L).
        return self.levels[int(self._episodes[i] * self.batch_size[0] + i) % len(self.levels)]

    def _reset_env(self, i: int) -> None:
        self._obs[i] = self.sim.reset_env(i, level=self._level(i))
        self._episodes[i] += 1
        self._return[i] = 0
        self._length[i] = 0

    def _root_entries(self) -> dict[str, Any]:
        E, R = self.batch_size[0], self.num_robots
        agents = TensorDict(
            {
                "observation": torch.from_numpy(self._obs.copy()),
                MASK_KEY: torch.from_numpy(self.sim.active & self.sim.present),
            },
            batch_size=[E, R],
        )
        shape = (E, 1)
        return {
            AGENTS: agents,
            "episode_reward": torch.from_numpy(self._return.copy()),
            "step_count": torch.from_numpy(self._length.copy()),
            "done": torch.zeros(shape, dtype=torch.bool),
            "terminated": torch.zeros(shape, dtype=torch.bool),
            "truncated": torch.zeros(shape, dtype=torch.bool),
        }

    def _outcome(self) -> dict[str, np.ndarray]:
        """The episode figures of every env now ``(E, 1)`` float32 (see :data:`OUTCOME_KEYS`)."""
        sim = self.sim
        present = sim.present
        n = np.maximum(present.sum(1), 1)
        success = np.all((sim.outcome == C.GOAL) | ~present, axis=1)
        collision = np.any((sim.outcome == C.COLLISION) & present, axis=1)
        figures = {
            "success": success,
            "collision": collision,
            "timeout": ~success & ~collision,
            "travel_time": (sim.travel_time * present).sum(1) / n,
            "energy": (sim.energy * present).sum(1) / n,
            "path_length": (sim.path_length * present).sum(1) / n,
        }
        return {k: v.astype(np.float32)[:, None] for k, v in figures.items()}

    # ------------------------------------------------------------------ TorchRL side
    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs: Any) -> TensorDictBase:
        for i in range(self.batch_size[0]):
            self._reset_env(i)
        root = self._root_entries()
        root.update({k: torch.from_numpy(v) for k, v in self._outcome().items()})
        return TensorDict(root, batch_size=self.batch_size)

    def _next_entries(self, tensordict: TensorDictBase) -> tuple[dict[str, Any], np.ndarray]:
        """Steps every env; the entries of ``"next"`` and the envs whose episode ended."""
        E, R = self.batch_size[0], self.num_robots
        action = tensordict.get((AGENTS, "action"))
        if action.requires_grad or action.device.type != "cpu":
            action = action.detach().cpu()
        result = self.sim.step(action.numpy())
        self.frames += E
        env_done = result.env_terminated | result.env_truncated
        # A robot still running when its episode ends otherwise (the timeout, another's collision) is cut off.
        truncated = result.truncated | (self.sim.active & env_done[:, None])
        terminated = result.terminated
        reward = result.reward.astype(np.float32)
        self._return += reward.sum(1, keepdims=True)
        self._length += 1
        agents = TensorDict(
            {
                "observation": torch.from_numpy(result.obs),
                MASK_KEY: torch.from_numpy(self.sim.active & self.sim.present),
                "reward": torch.from_numpy(reward[..., None]),
                "terminated": torch.from_numpy(terminated[..., None]),
                "truncated": torch.from_numpy(truncated[..., None]),
                "done": torch.from_numpy((terminated | truncated)[..., None]),
            },
            batch_size=[E, R],
        )
        entries = {
            AGENTS: agents,
            "episode_reward": torch.from_numpy(self._return.copy()),
            "step_count": torch.from_numpy(self._length.copy()),
            "done": torch.from_numpy(env_done[:, None].copy()),
            "terminated": torch.from_numpy(result.env_terminated[:, None].copy()),
            "truncated": torch.from_numpy(result.env_truncated[:, None].copy()),
        }
        entries.update({k: torch.from_numpy(v) for k, v in self._outcome().items()})
        self._obs = result.obs.copy()
        return entries, env_done

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        entries, _ = self._next_entries(tensordict)
        return TensorDict(entries, batch_size=self.batch_size)

    def step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """The collector's step: steps every env, then resets those whose episode ended, alone.

        The root of the next step holds the reset envs' first observations (and the others' next ones),
        plus what the policy wrote into this step's root besides the env's own entries.
        """
        entries, env_done = self._next_entries(tensordict)
        tensordict.set("next", TensorDict(entries, batch_size=self.batch_size))
        for i in np.flatnonzero(env_done):
            self._reset_env(int(i))
        root = self._root_entries()
        carried = tensordict.get(AGENTS).exclude("observation", MASK_KEY)
        root[AGENTS].update(carried)
        for key, value in tensordict.items():
            if key not in root and key != "next" and key not in OUTCOME_KEYS:
                root[key] = value
        root.update({k: entries[k] for k in OUTCOME_KEYS})
        return tensordict, TensorDict(root, batch_size=self.batch_size)

    def _set_seed(self, seed: int | None) -> None:
        self.sim.seed(seed)

    def call_gym_envs(self, method: str, **kwargs: Any) -> None:
        """Calls ``method(**kwargs)`` of this env (the training envs' port, as ``GymVecEnv`` offers it).

        Raises:
            AttributeError: no such method.
        """
        getattr(self, method)(**kwargs)


def make_marinenav_env(
    kwargs: Mapping[str, Any], num_envs: int, *, continuous: bool, train: bool, frames: int = 0
) -> MarineNavVecEnv:
    """The batched env of a marine-navigation id with the env config's ``kwargs`` (:class:`MarineNavVecEnv`).

    Raises:
        ValueError: a keyword the batched env does not take (one line naming those it takes).
    """
    allowed = (
        "schedule", "num_robots", "num_cores", "num_obstacles", "min_start_goal_dis", "max_robots",
        "perception_noise", "eval_end_on_collision",
    )  # fmt: skip
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise ValueError(
            f"env.kwargs {unknown} are not marine-navigation options; use some of {list(allowed)}."
        )
    return MarineNavVecEnv(num_envs, continuous=continuous, train=train, frames=frames, **dict(kwargs))


def gym_env_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The gymnasium env's keywords for the env config's ``kwargs``: one env that plays an episode as the
    evaluation plays it (a video), ``eval_end_on_collision`` becoming its ``end_on_collision``."""
    out = dict(kwargs)
    out["end_on_collision"] = bool(out.pop("eval_end_on_collision", True))
    return out
