"""An env's saved state, put into a fresh env of the same config, continues the episode exactly.

Each env plays some steps, its state goes through a checkpoint's round trip (``torch.save``, then
``torch.load(weights_only=True)``: plain values only) into a fresh env seeded otherwise, and both then take
the same actions through an episode end and into the next episode: the same observations, rewards and ends,
bit for bit. Losing a part of the state (the physics, the step limit's count, a generator, a frame stack,
the ALE's sticky-action generator) makes the two part.
"""

from __future__ import annotations

import importlib.util
import io

import numpy as np
import pytest
import torch

from rl_lightning.envs.factory import EnvConfig, make_gym_env
from rl_lightning.envs.state import env_state, load_env_state

HAS_IMAGES = all(importlib.util.find_spec(p) is not None for p in ("ale_py", "minatar"))
images = pytest.mark.skipif(not HAS_IMAGES, reason="needs the atari extra (ale-py, minatar)")

CASES = {
    "cartpole": (EnvConfig("CartPole-v1", max_episode_steps=40), 25, 200),
    "pendulum": (EnvConfig("Pendulum-v1", max_episode_steps=30), 20, 80),
    "trading": (EnvConfig("TradingStocks-v0", kwargs={"episode_length": 30}), 20, 80),
    "minatar": pytest.param((EnvConfig("MinAtar/Breakout-v1", preprocess="minatar"), 20, 400), marks=images),
    "atari": pytest.param(  # 3 s of emulation
        (EnvConfig("ALE/Breakout-v5", preprocess="atari", frame_stack=4), 60, 400),
        marks=[images, pytest.mark.slow],
    ),
}


def through_a_checkpoint(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def play(env, actions) -> list:
    out = []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, float(reward), terminated, truncated))
        if terminated or truncated:
            obs, _ = env.reset()
            out.append((obs, 0.0, False, False))
    return out


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_a_restored_env_continues_the_episode_bit_for_bit(case) -> None:
    cfg, before, after = case
    env, fresh = make_gym_env(cfg), make_gym_env(cfg)
    env.reset(seed=3)
    fresh.reset(seed=99)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(before + after)]
    play(env, actions[:before])
    state = env_state(env)
    assert state is not None
    load_env_state(fresh, through_a_checkpoint(state))
    ours, theirs = play(fresh, actions[before:]), play(env, actions[before:])
    assert any(t or tr for _, _, t, tr in theirs), "the actions should reach an episode end"
    assert len(ours) == len(theirs)
    for (o1, r1, t1, tr1), (o2, r2, t2, tr2) in zip(ours, theirs):
        assert np.array_equal(o1, o2) and (r1, t1, tr1) == (r2, t2, tr2)


@pytest.mark.parametrize("cut", [264, 486])
def test_a_restored_hockey_env_continues_bit_for_bit_where_bodies_touch(cut: int) -> None:
    """Hockey replays the episode in a fresh world: Box2D's contacts and solver order come back too. At
    these two points of a seeded game bodies touch, and bodies put back where they were without their
    contacts step on differently."""
    cfg = EnvConfig("HockeyVsOpponent-v0", kwargs={"mode": "NORMAL", "opponent": "weak"})
    env, fresh = make_gym_env(cfg), make_gym_env(cfg)
    env.reset(seed=0)
    fresh.reset(seed=9)
    actions = np.random.default_rng(1).uniform(-1, 1, (cut + 300, 4)).astype(np.float32)
    play(env, actions[:cut])
    load_env_state(fresh, through_a_checkpoint(env_state(env)))
    ours, theirs = play(fresh, actions[cut:]), play(env, actions[cut:])
    assert any(t or tr for _, _, t, tr in theirs), "the actions should reach an episode end"
    for (o1, r1, t1, tr1), (o2, r2, t2, tr2) in zip(ours, theirs):
        assert np.array_equal(o1, o2) and (r1, t1, tr1) == (r2, t2, tr2)


def test_a_hockey_env_moved_by_set_state_resumes_from_its_bodies() -> None:
    """After ``set_state`` (bodies teleported mid-episode) there is no episode to replay: the restored env
    starts from the same bodies and steps on to float32 rounding (Box2D's contacts are found again)."""
    cfg = EnvConfig("HockeyVsOpponent-v0")
    env, fresh = make_gym_env(cfg), make_gym_env(cfg)
    obs, _ = env.reset(seed=0)
    fresh.reset(seed=5)
    env.unwrapped.set_state(obs)
    actions = np.random.default_rng(1).uniform(-1, 1, (60, 4)).astype(np.float32)
    play(env, actions[:20])
    load_env_state(fresh, through_a_checkpoint(env_state(env)))
    assert fresh.unwrapped.obs_agent_two().tolist() == env.unwrapped.obs_agent_two().tolist()
    for (o1, r1, *_), (o2, r2, *_) in zip(play(fresh, actions[20:]), play(env, actions[20:])):
        assert np.allclose(o1, o2, atol=1e-4) and abs(r1 - r2) < 1e-4


def test_an_env_with_unknown_parts_has_no_state() -> None:
    """A wrapper the module does not know may keep anything: the env then has no saved state (a resume
    starts fresh episodes) rather than a partial one."""
    import gymnasium as gym

    class Counting(gym.Wrapper):
        pass

    env = Counting(make_gym_env(EnvConfig("CartPole-v1")))
    env.reset(seed=0)
    assert env_state(env) is None
    assert env_state(make_gym_env(EnvConfig("LunarLander-v3"))) is None
