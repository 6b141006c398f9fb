"""Marine navigation: surface vessels (WAM-V 16) steering to their goals among each other and obstacles.

Our implementation of the public multi-vehicle env of Lin et al. (RA-L 2025), vectorized over robots and
envs; ``docs/marinenav.md`` is its specification. Gymnasium ids (after :func:`register_envs`):
``MarineNav-v0`` (25 discrete thrust changes per robot) and ``MarineNavContinuous-v0`` (``[-1, 1]²`` per
robot), both on the public training curriculum unless ``schedule=None``.
"""

from __future__ import annotations

import gymnasium as gym

from rl_lightning.envs.marinenav.constants import PAPER_SCHEDULE, Level, Schedule, VesselParams
from rl_lightning.envs.marinenav.core import MarineNavBatch, StepResult, split_observation
from rl_lightning.envs.marinenav.env import MarineNavEnv
from rl_lightning.envs.marinenav.scenario import Scenario, generate
from rl_lightning.envs.marinenav.torchrl_env import (
    OUTCOME_KEYS,
    MarineNavVecEnv,
    gym_env_kwargs,
    make_marinenav_env,
)

__all__ = [
    "ENV_IDS",
    "OUTCOME_KEYS",
    "PAPER_SCHEDULE",
    "Level",
    "MarineNavBatch",
    "MarineNavEnv",
    "MarineNavVecEnv",
    "Scenario",
    "Schedule",
    "StepResult",
    "VesselParams",
    "generate",
    "gym_env_kwargs",
    "make_marinenav_env",
    "register_envs",
    "split_observation",
]

# id -> (entry point, default kwargs). No max_episode_steps: the env truncates itself (1001 steps).
ENV_IDS: dict[str, tuple[str, dict[str, object]]] = {
    "MarineNav-v0": ("rl_lightning.envs.marinenav.env:MarineNavEnv", {"continuous": False}),
    "MarineNavContinuous-v0": ("rl_lightning.envs.marinenav.env:MarineNavEnv", {"continuous": True}),
}


def register_envs() -> None:
    """Registers the marine-navigation ids with gymnasium; ids already registered are left alone."""
    for env_id, (entry_point, kwargs) in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))
