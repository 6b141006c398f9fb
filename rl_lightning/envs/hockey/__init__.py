"""Laser hockey: a Box2D implementation of the Tübingen RL course's two-player hockey game.

Gymnasium ids (after :func:`register_envs`): ``Hockey-v0`` (two players, 8-dim action),
``HockeyVsOpponent-v0`` (player 1 against a :class:`BasicOpponent`, 4-dim action) and
``HockeyVsOpponentDiscrete-v0`` (the same with the 8 discrete codes).
"""

from __future__ import annotations

import gymnasium as gym

from rl_lightning.envs.hockey.constants import Mode
from rl_lightning.envs.hockey.env import CategoricalMix, HockeyEnv, mirror_observation
from rl_lightning.envs.hockey.opponent import BasicOpponent
from rl_lightning.envs.hockey.single import (
    DISCRETE_ACTIONS,
    NAMED_OPPONENTS,
    DiscreteActionWrapper,
    HockeyVsOpponentEnv,
    PolicyOpponent,
    discrete_to_continuous,
    make_vs_opponent_discrete,
)

__all__ = [
    "DISCRETE_ACTIONS",
    "ENV_IDS",
    "NAMED_OPPONENTS",
    "BasicOpponent",
    "CategoricalMix",
    "DiscreteActionWrapper",
    "HockeyEnv",
    "HockeyVsOpponentEnv",
    "Mode",
    "PolicyOpponent",
    "discrete_to_continuous",
    "make_vs_opponent_discrete",
    "mirror_observation",
    "register_envs",
]

# id -> (entry point, default kwargs). No max_episode_steps: the envs truncate themselves (251 / 81 steps).
ENV_IDS: dict[str, tuple[str, dict[str, object]]] = {
    "Hockey-v0": ("rl_lightning.envs.hockey.env:HockeyEnv", {"mode": "NORMAL"}),
    "HockeyVsOpponent-v0": (
        "rl_lightning.envs.hockey.single:HockeyVsOpponentEnv",
        {"mode": "NORMAL", "opponent": "weak"},
    ),
    "HockeyVsOpponentDiscrete-v0": (
        "rl_lightning.envs.hockey.single:make_vs_opponent_discrete",
        {"mode": "NORMAL", "opponent": "weak"},
    ),
}


def register_envs() -> None:
    """Registers the hockey ids with gymnasium; ids already in ``gymnasium.registry`` are left alone."""
    for env_id, (entry_point, kwargs) in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=entry_point, kwargs=dict(kwargs))
