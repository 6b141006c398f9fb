"""Gymnasium behaviour of the hockey envs: spaces, episodes, resets, rewards, modes, registration, frames."""

from __future__ import annotations

import math
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import DependencyNotInstalled
from gymnasium.utils.env_checker import check_env

from rl_lightning.envs.hockey import ENV_IDS, HockeyEnv, HockeyVsOpponentEnv, Mode, register_envs
from rl_lightning.envs.hockey import constants as C
from rl_lightning.envs.hockey.render import BLACK, BLUE, GREY, ORANGE, RED, WHITE


def episode_length(env: gym.Env, seed: int, action: np.ndarray) -> tuple[int, bool, bool]:
    env.reset(seed=seed)
    for t in range(1, 400):
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            return t, terminated, truncated
    raise AssertionError("no episode end")


def test_spaces_and_dtypes() -> None:
    env = HockeyEnv()
    assert env.observation_space == gym.spaces.Box(-np.inf, np.inf, (18,), np.float32)
    assert env.action_space == gym.spaces.Box(-1, 1, (8,), np.float32)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (18,)
    assert set(info) == {"winner", "reward_closeness_to_puck", "reward_touch_puck", "reward_puck_direction"}
    obs, reward, *_ = env.step(env.action_space.sample())
    assert obs.dtype == np.float32 and isinstance(reward, float)
    assert env.obs_agent_two().dtype == np.float32
    single = HockeyVsOpponentEnv()
    assert single.action_space.shape == (4,) and single.observation_space.shape == (18,)
    assert HockeyEnv(keep_mode=False).reset(seed=0)[0].shape == (18,)


def test_returned_observations_are_not_reused() -> None:
    env = HockeyEnv()
    first, _ = env.reset(seed=0)
    kept = first.copy()
    second, *_ = env.step(np.ones(8, dtype=np.float32))
    assert second is not first
    np.testing.assert_array_equal(first, kept)


@pytest.mark.parametrize(("mode", "length"), [(Mode.NORMAL, 251), (Mode.TRAIN_SHOOTING, 81)])
def test_timeout_is_truncation_at_the_course_lengths(mode: Mode, length: int) -> None:
    env = HockeyEnv(mode=mode)
    assert episode_length(env, 0, np.zeros(8, dtype=np.float32)) == (length, False, True)
    assert env.max_timesteps == length - 1


def test_defense_episodes_end_by_goal_or_after_81_steps() -> None:
    env = HockeyEnv(mode="TRAIN_DEFENSE")
    outcomes = set()
    for seed in range(12):
        t, terminated, truncated = episode_length(env, seed, np.zeros(8, dtype=np.float32))
        assert terminated != truncated
        assert t <= 81 and (terminated or t == 81)
        outcomes.add(terminated)
    assert outcomes == {True, False}


@pytest.mark.parametrize("form", [Mode.TRAIN_DEFENSE, "TRAIN_DEFENSE", "train_defense", 2])
def test_mode_argument_forms(form: Mode | str | int) -> None:
    env = HockeyEnv(mode=form)
    assert env.mode is Mode.TRAIN_DEFENSE and env.max_timesteps == 80


@pytest.mark.parametrize(
    ("form", "error"), [("EASY", ValueError), (3, ValueError), (1.0, TypeError), (True, TypeError)]
)
def test_bad_modes_are_rejected(form: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        HockeyEnv(mode=form)  # type: ignore[arg-type]


def test_mode_switch_through_reset_options() -> None:
    env = HockeyEnv()
    env.reset(seed=0, options={"mode": "TRAIN_SHOOTING"})
    assert env.mode is Mode.TRAIN_SHOOTING
    assert episode_length(env, 1, np.zeros(8, dtype=np.float32))[0] == 81
    env.reset(options={"mode": 0})
    assert env.max_timesteps == 250


CURRICULUM = {"NORMAL": 0.5, "TRAIN_SHOOTING": 0.25, "TRAIN_DEFENSE": 0.25}


def test_mode_mix_draws_each_episode_its_mode_starts_and_time_limit() -> None:
    env = HockeyVsOpponentEnv(mode=CURRICULUM)
    zero = np.zeros(4, dtype=np.float32)
    seen: dict[Mode, list[int]] = {m: [] for m in Mode}
    env.reset(seed=0)
    for _ in range(300):
        obs = env.reset()[0]
        mode = env.mode
        # Start positions follow the drawn mode: NORMAL puts player 2 at x = 3 and the puck 1-2 m from
        # the centre; TRAIN_SHOOTING puts the puck in player 1's half, TRAIN_DEFENSE in player 2's.
        if mode is Mode.NORMAL:
            assert (obs[6], obs[7]) == (3.0, 0.0) and 1 <= abs(obs[12]) <= 2
        elif mode is Mode.TRAIN_SHOOTING:
            assert -2 <= obs[12] <= -1
        else:
            assert 0 <= obs[12] <= 10 / 3
        t, terminated, truncated = 0, False, False
        while not (terminated or truncated):
            _, _, terminated, truncated, _ = env.step(zero)
            t += 1
        assert t <= mode.max_timesteps + 1 and (terminated or t == mode.max_timesteps + 1)
        assert env.max_timesteps == mode.max_timesteps
        seen[mode].append(t)
    counts = {m: len(v) for m, v in seen.items()}
    assert counts[Mode.NORMAL] / 300 == pytest.approx(0.5, abs=0.1)
    assert counts[Mode.TRAIN_SHOOTING] / 300 == pytest.approx(0.25, abs=0.08)
    assert counts[Mode.TRAIN_DEFENSE] / 300 == pytest.approx(0.25, abs=0.08)
    # Timeouts follow the drawn mode: 251 steps in NORMAL, 81 in the training modes.
    assert max(seen[Mode.NORMAL]) == 251 and 251 not in seen[Mode.TRAIN_DEFENSE]
    assert max(seen[Mode.TRAIN_DEFENSE]) == 81


def test_mode_mix_is_seeded_and_a_reset_option_fixes_the_mode() -> None:
    def modes(seed: int) -> list[Mode]:
        env = HockeyEnv(mode={Mode.TRAIN_SHOOTING: 1, "train_defense": 1})
        env.reset(seed=seed)
        return [env.mode] + [(env.reset(), env.mode)[1] for _ in range(40)]

    assert modes(3) == modes(3) and set(modes(3)) == {Mode.TRAIN_SHOOTING, Mode.TRAIN_DEFENSE}
    assert modes(3) != modes(4)
    env = HockeyEnv(mode={2: 1.0})
    assert all((env.reset(seed=s), env.mode)[1] is Mode.TRAIN_DEFENSE for s in range(5))
    env = HockeyEnv(mode=CURRICULUM)
    env.reset(seed=0, options={"mode": "NORMAL"})
    assert env.mode_mix is None and all((env.reset(), env.mode)[1] is Mode.NORMAL for _ in range(30))


@pytest.mark.parametrize(
    "mix",
    [{}, {"NORMAL": 0.0}, {"NORMAL": -1.0, "TRAIN_DEFENSE": 2.0}, {"EASY": 1.0}, {"NORMAL": 1, 0: 1},
     {"NORMAL": "often"}, {"NORMAL": float("nan")}],
)  # fmt: skip
def test_bad_mode_mixes_are_rejected(mix: dict) -> None:
    with pytest.raises(ValueError, match="mode"):
        HockeyEnv(mode=mix)


def draws(mode: Mode, n: int = 1500) -> np.ndarray:
    env = HockeyEnv(mode=mode)
    env.reset(seed=0)
    return np.stack([env.reset()[0] for _ in range(n)])


def test_reset_distribution_normal() -> None:
    obs = draws(Mode.NORMAL)
    np.testing.assert_array_equal(obs[:, [0, 1, 6, 7]], np.tile([-3, 0, 3, 0], (len(obs), 1)))
    assert not obs[:, [2, 3, 4, 5, 8, 9, 10, 11, 14, 15, 16, 17]].any()
    px, py = obs[:, 12], obs[:, 13]
    assert np.all((np.abs(px) >= 1) & (np.abs(px) <= 2)) and np.all(np.abs(py) <= 1)
    assert np.abs(px).min() < 1.01 and np.abs(px).max() > 1.99 and py.min() < -0.99 and py.max() > 0.99
    # Unseeded resets alternate who starts (the puck's half).
    sides = np.sign(px)
    assert np.all(sides[1:] == -sides[:-1])


def test_reset_distribution_training_modes() -> None:
    for mode in (Mode.TRAIN_SHOOTING, Mode.TRAIN_DEFENSE):
        obs = draws(mode)
        x2, y2 = obs[:, 6], obs[:, 7]
        assert x2.min() >= -1 / 3 - 1e-6 and x2.max() <= 3 + 5 / 3 + 1e-6
        assert x2.min() < -1 / 3 + 0.03 and x2.max() > 3 + 5 / 3 - 0.03
        assert y2.min() >= -2 and y2.max() <= 2 and y2.min() < -1.99 and y2.max() > 1.99
        px, py = obs[:, 12], obs[:, 13]
        if mode is Mode.TRAIN_SHOOTING:
            assert px.min() >= -2 and px.max() <= -1 and px.min() < -1.99 and px.max() > -1.01
            assert py.min() >= -1 and py.max() <= 1
        else:
            assert px.min() >= 0 and px.max() <= 10 / 3 and px.min() < 0.01 and px.max() > 10 / 3 - 0.01
            assert py.min() >= -3.2 and py.max() <= 3.2 and py.min() < -3.18 and py.max() > 3.18


def test_defense_shot_aims_behind_player_ones_goal() -> None:
    env = HockeyEnv(mode=Mode.TRAIN_DEFENSE)
    env.reset(seed=0)
    hits = []
    for _ in range(300):
        start, _ = env.reset()
        obs, *_ = env.step(np.zeros(8, dtype=np.float32))
        vx, vy = float(obs[14]), float(obs[15])
        assert math.hypot(vx, vy) == pytest.approx(60 * 0.999, rel=1e-4)
        # Extend the shot to the rink's left edge (x = -5 relative).
        hits.append(start[13] + vy / vx * (-5 - start[12]))
    hits = np.array(hits)
    assert hits.min() >= -0.75 - 1e-3 and hits.max() <= 0.75 + 1e-3
    assert hits.min() < -0.7 and hits.max() > 0.7


def test_one_starting_option() -> None:
    env = HockeyEnv()
    assert env.reset(seed=0, options={"one_starting": True})[0][12] < 0 and env.one_starts
    assert env.reset(options={"one_starting": False})[0][12] > 0 and not env.one_starts
    shooting = HockeyEnv(mode=Mode.TRAIN_SHOOTING)
    assert shooting.reset(seed=0, options={"one_starting": False})[0][12] < 0


def test_closeness_reward_formula() -> None:
    for mode, per_metre in ((Mode.NORMAL, -0.0576), (Mode.TRAIN_SHOOTING, -0.18)):
        env = HockeyEnv(mode=mode)
        obs, info = env.reset(seed=0, options={"one_starting": True})
        dist = math.hypot(obs[0] - obs[12], obs[1] - obs[13])
        assert info["reward_closeness_to_puck"] == pytest.approx(per_metre * dist, rel=1e-6)
        obs, reward, *_, info = env.step(np.zeros(8, dtype=np.float32))
        dist = math.hypot(obs[0] - obs[12], obs[1] - obs[13])
        assert reward == info["reward_closeness_to_puck"] == pytest.approx(per_metre * dist, rel=1e-6)
        assert info["reward_puck_direction"] == pytest.approx(obs[14] / ((env.max_timesteps) * 25))
    env = HockeyEnv()
    env.reset(seed=0, options={"one_starting": False})  # puck in player 2's half: no penalty for player 1
    assert env.step(np.zeros(8, dtype=np.float32))[4]["reward_closeness_to_puck"] == 0.0
    assert env.get_info_agent_two()["reward_closeness_to_puck"] < 0.0


def rollout(env: gym.Env, seed: int, steps: int, action_seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(action_seed)
    out = [env.reset(seed=seed)[0]]
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(rng.uniform(-1, 1, env.action_space.shape))
        out.append(np.append(obs, reward))
        if terminated or truncated:
            out.append(env.reset()[0])
    return np.concatenate(out)


@pytest.mark.parametrize("make", [HockeyEnv, lambda: HockeyEnv(mode="TRAIN_DEFENSE")])
def test_same_seed_same_episode(make) -> None:
    env = make()
    a = rollout(env, 3, 300)
    b = rollout(env, 3, 300)  # same instance, after history
    c = rollout(make(), 3, 300)  # fresh instance
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, rollout(make(), 4, 300))


def test_registration_is_idempotent_and_makes_each_id() -> None:
    register_envs()
    register_envs()
    assert set(ENV_IDS) == {"Hockey-v0", "HockeyVsOpponent-v0", "HockeyVsOpponentDiscrete-v0"}
    expected_actions = {
        "Hockey-v0": gym.spaces.Box(-1, 1, (8,), np.float32),
        "HockeyVsOpponent-v0": gym.spaces.Box(-1, 1, (4,), np.float32),
        "HockeyVsOpponentDiscrete-v0": gym.spaces.Discrete(8),
    }
    for env_id, space in expected_actions.items():
        assert gym.spec(env_id).max_episode_steps is None
        env = gym.make(env_id)
        assert env.action_space == space
        obs, _ = env.reset(seed=0)
        assert obs.shape == (18,) and obs.dtype == np.float32
        env.step(env.action_space.sample())
    unwrapped = gym.make("HockeyVsOpponent-v0").unwrapped
    assert unwrapped.mode is Mode.NORMAL and unwrapped.opponent_name == "weak"
    strong = gym.make("HockeyVsOpponent-v0", opponent="strong", mode="TRAIN_SHOOTING").unwrapped
    assert strong.opponent_name == "strong" and strong.mode is Mode.TRAIN_SHOOTING


def test_gymnasium_env_checker() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unbounded observation box is intended
        check_env(HockeyEnv(), skip_render_check=True)
        check_env(HockeyVsOpponentEnv(opponent="strong"), skip_render_check=True)


def test_sync_vector_env() -> None:
    register_envs()
    envs = gym.make_vec("HockeyVsOpponent-v0", num_envs=3, vectorization_mode="sync")
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 18) and obs.dtype == np.float32
    for _ in range(5):
        obs, reward, _, _, info = envs.step(envs.action_space.sample())
    assert reward.shape == (3,) and "winner" in info
    envs.close()


def pixel(frame: np.ndarray, x_px: float, y_px: float) -> tuple[int, ...]:
    """The colour at world pixel (x, y), y measured up from the bottom edge."""
    return tuple(int(v) for v in frame[C.VIEWPORT_H - 1 - int(y_px), int(x_px)])


def test_rgb_array_frame_colours() -> None:
    env = HockeyEnv(render_mode="rgb_array")
    env.reset(seed=0)
    # Puck in the upper half, away from everything: y up means it shows in the upper image rows.
    state = np.zeros(18)
    state[0], state[6], state[12], state[13] = -3, 3, -1.0, 2.0
    env.set_state(state)
    frame = env.render()
    assert frame.shape == (480, 600, 3) and frame.dtype == np.uint8
    assert pixel(frame, 120, 240) == RED  # player 1's origin at world (2, 4)
    assert pixel(frame, 480, 240) == BLUE
    assert pixel(frame, 240, 360) == BLACK  # the puck at world (4, 6)
    assert pixel(frame, 240, 120) == WHITE  # its mirror image below stays empty
    assert pixel(frame, 300, 240) == GREY  # centre circle
    assert pixel(frame, 300, 330) == GREY and pixel(frame, 300, 345) == WHITE  # radius ~100 px
    assert pixel(frame, 20, 240) == ORANGE and pixel(frame, 580, 240) == ORANGE  # behind the goal mouths
    assert pixel(frame, 300, 30) == BLACK and pixel(frame, 300, 450) == BLACK  # bottom and top walls
    assert pixel(frame, 55, 100) == BLACK and pixel(frame, 55, 240) == ORANGE  # side wall, mouth opening
    assert pixel(frame, 90, 240) == WHITE  # inside the rink next to the left mouth
    assert HockeyEnv().render() is None  # no render_mode: warn and return nothing


def test_human_mode_needs_pygame(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pygame", None)
    env = HockeyEnv(render_mode="human")
    with pytest.raises(DependencyNotInstalled, match="pygame"):
        env.reset(seed=0)


def test_human_mode_window(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pygame")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")
    monkeypatch.setenv("SDL_AUDIODRIVER", "dummy")
    import pygame

    env = HockeyEnv(render_mode="human")
    twin = HockeyEnv(render_mode="rgb_array")
    action = np.full(8, 0.5, dtype=np.float32)
    for e in (env, twin):
        e.reset(seed=0)
        e.step(action)
    # The window shows exactly the frame the rgb_array renderer draws for the same state.
    shown = pygame.surfarray.array3d(pygame.display.get_surface()).swapaxes(0, 1)
    assert shown.shape == (480, 600, 3)
    np.testing.assert_array_equal(shown, twin.render())
    env.close()
    assert not pygame.display.get_init()


def test_bad_render_mode() -> None:
    with pytest.raises(ValueError, match="render_mode"):
        HockeyEnv(render_mode="ansi")
