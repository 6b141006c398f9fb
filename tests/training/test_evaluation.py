"""Evaluation counts every env's episodes alike, whatever their lengths."""

from __future__ import annotations

import gymnasium as gym
import lightning as L
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

from rl_lightning.envs.factory import EnvConfig
from rl_lightning.training.evaluation import evaluate_policy

ENV_ID = "RLLightningTest/SeedLength-v0"


class SeedLengthEnv(gym.Env):
    """Episodes of 1 step (a win) after an even first seed, of 20 steps (a draw) after an odd one."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.length, self.t = 1, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.length = 1 if seed % 2 == 0 else 20
        self.t = 0
        return np.zeros(1, np.float32), {"winner": 0.0}

    def step(self, action):
        self.t += 1
        done = self.t >= self.length
        winner = 1.0 if done and self.length == 1 else 0.0
        return np.zeros(1, np.float32), 1.0, done, False, {"winner": winner}


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=SeedLengthEnv)


class ZeroPolicy(L.LightningModule):
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        td.set("action", torch.zeros(*td.batch_size, 1))
        return td


@pytest.mark.parametrize(("n_envs", "episodes"), [(1, 3), (2, 4), (2, 5), (4, 4), (8, 4)])
def test_each_env_contributes_a_fixed_share_of_the_episodes(n_envs: int, episodes: int) -> None:
    # Env i is seeded with seed + i: with seed 0 the even envs play 1-step wins, the odd ones 20-step draws.
    cfg = EnvConfig(id=ENV_ID, eval_num_envs=n_envs, info_keys=("winner",))
    stats = evaluate_policy(ZeroPolicy(), cfg, episodes=episodes, seed=0)
    used = min(n_envs, episodes)
    per_env = [episodes // used + (i < episodes % used) for i in range(used)]
    short = sum(per_env[0::2])
    long = sum(per_env[1::2])
    assert stats["length_mean"] == pytest.approx((short * 1 + long * 20) / episodes)
    assert stats["return_mean"] == pytest.approx(stats["length_mean"])
    assert stats["win_rate"] == pytest.approx(short / episodes)
    assert stats["draw_rate"] == pytest.approx(long / episodes) and stats["loss_rate"] == 0.0
