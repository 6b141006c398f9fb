"""Marine-navigation env: gymnasium API, ids, seeding, curriculum, scenarios, batches, episode ends."""

from __future__ import annotations

import math
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rl_lightning.envs.marinenav import (
    ENV_IDS,
    PAPER_SCHEDULE,
    Level,
    MarineNavBatch,
    MarineNavEnv,
    Scenario,
    Schedule,
    generate,
    register_envs,
)
from rl_lightning.envs.marinenav import constants as C

PUBLIC_SCHEDULE = {
    "timesteps": [0, 1000000, 2000000, 3000000, 4000000, 5000000],
    "num_robots": [3, 4, 5, 5, 5, 5],
    "num_cores": [0, 0, 0, 0, 0, 0],
    "num_obstacles": [0, 0, 0, 2, 3, 4],
    "min_start_goal_dis": [30.0, 35.0, 40.0, 40.0, 40.0, 40.0],
}


def rollout(env: gym.Env, seed: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    frames, rewards = [obs], []
    for _ in range(steps):
        obs, _, terminated, truncated, info = env.step(env.action_space.sample())
        frames.append(obs)
        rewards.append(info["agent_reward"])
        if terminated or truncated:
            break
    return np.array(frames), np.array(rewards)


@pytest.mark.parametrize("env_id", sorted(ENV_IDS))
def test_registered_ids_pass_the_gymnasium_checker(env_id: str) -> None:
    register_envs()
    env = gym.make(env_id)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*infinity.*")
        check_env(env.unwrapped, skip_render_check=True)
    assert env.observation_space.shape == (5, 37) and env.observation_space.dtype == np.float32
    if env_id == "MarineNav-v0":
        assert env.action_space == gym.spaces.MultiDiscrete(np.full(5, 25))
    else:
        assert env.action_space == gym.spaces.Box(-1, 1, (5, 2), np.float32)


def test_same_seed_same_episode_other_seed_other_episode() -> None:
    env = MarineNavEnv(schedule=None, num_robots=4, num_cores=3, num_obstacles=4)
    a_obs, a_rew = rollout(env, 3, 40)
    b_obs, b_rew = rollout(env, 3, 40)
    np.testing.assert_array_equal(a_obs, b_obs)
    np.testing.assert_array_equal(a_rew, b_rew)
    c_obs, _ = rollout(env, 4, 40)
    assert not np.array_equal(a_obs[0], c_obs[0])


def test_paper_schedule_levels_follow_the_env_step_count() -> None:
    assert Schedule.from_dict(PUBLIC_SCHEDULE) == PAPER_SCHEDULE
    assert [PAPER_SCHEDULE.level_index(t) for t in (0, 999_999, 1_000_000, 3_500_000, 6_000_000)] == [
        0,
        0,
        1,
        3,
        5,
    ]
    env = MarineNavEnv()
    _, info = env.reset(seed=0)
    assert info["present"].sum() == 3 and info["level"] == 0
    env.total_steps = 5_000_000
    _, info = env.reset(seed=0)
    assert info["present"].sum() == 5 and info["level"] == 5 and len(env.sim.obstacle_present[0]) == 4
    assert env.sim.obstacle_present[0].sum() == 4
    _, info = env.reset(seed=0, options={"level": 1})
    assert info["present"].sum() == 4 and info["level"] == 1


def test_env_counts_its_steps_for_the_curriculum() -> None:
    schedule = Schedule((0, 5), (Level(2, 0, 0, 30.0), Level(4, 0, 1, 30.0)))
    env = MarineNavEnv(schedule=schedule)
    env.reset(seed=0)
    for _ in range(5):
        env.step(np.zeros(4, dtype=np.int64))
    _, info = env.reset()
    assert env.total_steps == 5 and info["present"].sum() == 4


@pytest.mark.parametrize("seed", range(6))
def test_generated_scenarios_keep_the_public_distances(seed: int) -> None:
    level = Level(5, 6, 6, 40.0)
    s = generate(np.random.default_rng(seed), level)
    assert s.num_robots == 5
    assert np.all(np.linalg.norm(s.goals - s.starts, axis=1) >= 40.0)
    assert np.all((s.starts >= 2.0) & (s.starts <= 53.0)) and np.all((s.goals >= 2.0) & (s.goals <= 53.0))
    for ends in (s.starts, s.goals):
        d = np.linalg.norm(ends[:, None] - ends[None], axis=-1) + np.eye(5) * 1e9
        assert d.min() > C.CLEAR_R
    ends = np.concatenate([s.starts, s.goals])
    for x, y, r in s.obstacles:
        assert np.linalg.norm(ends - [x, y], axis=1).min() >= r + C.CLEAR_R
        assert C.OBSTACLE_MARGIN <= x <= 50 and C.OBSTACLE_MARGIN <= y <= 50 and r == 1.0
    if len(s.obstacles) > 1:
        d = np.linalg.norm(s.obstacles[:, None, :2] - s.obstacles[None, :, :2], axis=-1)
        assert (d + np.eye(len(d)) * 1e9).min() > 2.0
    for x, y, cw, gamma in s.cores:
        assert gamma == pytest.approx(3 * math.pi) and cw in (0.0, 1.0)
        assert np.linalg.norm(ends - [x, y], axis=1).min() >= C.CORE_R + C.CLEAR_R
    same = s.cores[:, None, 2] == s.cores[None, :, 2]
    d = np.linalg.norm(s.cores[:, None, :2] - s.cores[None, :, :2], axis=-1)
    assert np.all(d[same & ~np.eye(len(d), dtype=bool)] >= 3.0)  # Γ/2π + Γ/2π at v_rel_max = 1


def test_batch_of_envs_with_different_robot_counts_equals_separate_runs() -> None:
    rng = np.random.default_rng(0)
    scenarios = [generate(rng, Level(n, 2, 2, 30.0)) for n in (2, 4, 3)]
    batch = MarineNavBatch(3, 4, 2, 2, perception_noise=False)
    obs = batch.reset(scenarios)
    singles = [MarineNavBatch(1, 4, 2, 2, perception_noise=False) for _ in scenarios]
    single_obs = [s.reset([sc]) for s, sc in zip(singles, scenarios, strict=True)]
    np.testing.assert_array_equal(obs, np.concatenate(single_obs))
    assert batch.present.sum(axis=1).tolist() == [2, 4, 3]
    for _ in range(60):
        actions = rng.integers(0, 25, size=(3, 4))
        result = batch.step(actions)
        parts = [s.step(actions[i : i + 1]) for i, s in enumerate(singles)]
        np.testing.assert_array_equal(result.obs, np.concatenate([p.obs for p in parts]))
        np.testing.assert_array_equal(result.reward, np.concatenate([p.reward for p in parts]))
        np.testing.assert_array_equal(result.terminated, np.concatenate([p.terminated for p in parts]))
        # Absent robot slots stay empty.
        assert not result.obs[~batch.present].any() and not result.reward[~batch.present].any()
        if result.env_terminated.any():
            break


def test_info_reports_per_robot_outcomes_and_success() -> None:
    scenario = Scenario.make([[10, 10], [10, 40]], [[16, 10], [16, 40]], [0.0, 0.0])
    env = MarineNavEnv(schedule=None, num_robots=2, perception_noise=False)
    _, info = env.reset(options={"scenario": scenario})
    assert not info["success"] and info["active"].tolist() == [True, True]
    for _ in range(30):
        _, reward, terminated, truncated, info = env.step(np.array([24, 24]))
        if terminated:
            break
    assert terminated and not truncated and info["success"]
    assert info["outcome"].tolist() == [C.GOAL, C.GOAL] and info["agent_terminated"].tolist() == [True, True]
    assert reward == pytest.approx(info["agent_reward"].sum())
    np.testing.assert_allclose(info["travel_time"], info["travel_time"][0])
    assert info["travel_time"][0] == pytest.approx(0.5 * env.total_steps)
    # Energy: |T_L| + |T_R| times 0.5 s per step; thrusts 500, 1000, 1000, ... per thruster.
    expected = 2 * 0.5 * (500.0 + 1000.0 * (env.total_steps - 1))
    np.testing.assert_allclose(info["energy"], expected)
    assert np.all(info["path_length"] > 3.9)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.array([0, 0]))


def test_end_on_collision_ends_the_episode_at_the_first_collision() -> None:
    starts, goals = [[10, 10], [20, 10], [10, 40]], [[50, 10], [-30, 10], [50, 40]]
    scenario = Scenario.make(starts, goals, [0.0, math.pi, 0.0])
    outcomes = {}
    for rule in (False, True):
        env = MarineNavEnv(schedule=None, num_robots=3, perception_noise=False, end_on_collision=rule)
        env.reset(options={"scenario": scenario})
        for _ in range(30):
            _, _, terminated, _, info = env.step(np.array([24, 24, 0]))
            if info["collided"].any():
                break
        outcomes[rule] = terminated
        assert info["active"].tolist() == [False, False, True]
    assert outcomes == {False: False, True: True}


def test_public_episode_records_load_as_scenarios() -> None:
    record = {
        "env": {
            "cores": {"positions": [[5.0, 6.0]], "clockwise": [True], "Gamma": [9.42]},
            "obstacles": {"positions": [[20.0, 21.0], [30.0, 31.0]], "r": [1.0, 1.0]},
        },
        "robots": {
            "start": [[2.0, 3.0], [40.0, 41.0]],
            "goal": [[50.0, 3.0], [4.0, 5.0]],
            "init_theta": [0.5, 1.5],
        },
    }
    s = Scenario.from_public(record)
    np.testing.assert_array_equal(s.cores, [[5.0, 6.0, 1.0, 9.42]])
    np.testing.assert_array_equal(s.obstacles[:, 2], [1.0, 1.0])
    env = MarineNavEnv(schedule=None, num_robots=2, num_cores=1, num_obstacles=2)
    env.reset(options={"scenario": record})
    np.testing.assert_array_equal(env.sim.pos[0], [[2.0, 3.0], [40.0, 41.0]])


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: MarineNavEnv(schedule="easy"), ValueError, "unknown marine-navigation schedule"),
        (lambda: MarineNavEnv(num_robots=3), ValueError, "pass schedule=None"),
        (lambda: MarineNavEnv(max_robots=3), ValueError, "below the 5 robots"),
        (lambda: MarineNavEnv().reset(options={"speed": 1}), ValueError, "unknown reset options"),
        (lambda: MarineNavEnv().reset(options={"level": 9}), ValueError, "not in the schedule"),
        (lambda: Schedule((1,), (Level(1, 0, 0, 1.0),)), ValueError, "start at 0"),
    ],
)
def test_bad_arguments_fail_with_one_clear_line(make, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_bad_actions_are_rejected() -> None:
    env = MarineNavEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"\[0, 25\)"):
        env.step(np.array([0, 0, 25, 0, 0]))
    with pytest.raises(ValueError, match="integers"):
        env.step(np.array([0, 0, 0.5, 0, 0]))


def test_resetting_one_env_leaves_the_others_noise_streams_alone() -> None:
    level = Level(3, 0, 2, 30.0)
    runs = []
    for extra_reset in (False, True):
        sim = MarineNavBatch(2, 3, 2, 1, perception_noise=True)
        sim.seed([11, 12])
        sim.reset(level=level)
        rows = []
        for t in range(8):
            if extra_reset and t == 3:
                first = sim.reset_env(1, level=level)
                assert first.shape == (3, 37) and first[:, :2].any()
            rows.append(sim.step(np.zeros((2, 3), dtype=np.int64)).obs[0])
        runs.append(np.array(rows))
    np.testing.assert_array_equal(runs[0], runs[1])
