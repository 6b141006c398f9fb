"""Physics facts of the hockey env, measured against the numbers of the course environment."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rl_lightning.envs.hockey import HockeyEnv, Mode, mirror_observation
from rl_lightning.envs.hockey import constants as C


def make_state(
    p1: tuple[float, ...] = (-3, 0, 0, 0, 0, 0),
    p2: tuple[float, ...] = (3, 0, 0, 0, 0, 0),
    puck: tuple[float, ...] = (0, 3, 0, 0),
    holds: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """An 18-dim state in the observation layout; the default puck sits out of the players' way."""
    s = np.zeros(18)
    s[0:6], s[6:12], s[12:16], s[16:18] = p1, p2, puck, holds
    return s


def run(env: HockeyEnv, actions: np.ndarray | list[float], steps: int, state: np.ndarray | None = None):
    env.reset(seed=0)
    env.set_state(make_state() if state is None else state)
    out = []
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(np.asarray(actions, dtype=np.float32))
        out.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return out


def observations(trace) -> np.ndarray:
    return np.stack([t[0] for t in trace])


@pytest.fixture
def env() -> HockeyEnv:
    return HockeyEnv()


def test_masses_centre_of_mass_and_inertia(env: HockeyEnv) -> None:
    w = env.world
    assert w.player1.mass == pytest.approx(58.0, abs=1e-3)
    assert w.player2.mass == pytest.approx(58.0, abs=1e-3)
    assert w.puck.mass == pytest.approx(1.0324, abs=2e-4)
    assert w.player1.localCenter.x == pytest.approx(-0.1224, abs=1e-3)
    assert w.player2.localCenter.x == pytest.approx(0.1224, abs=1e-3)
    assert w.player1.inertia == pytest.approx(4.578, abs=2e-3)


def test_first_step_velocity_change_from_full_force(env: HockeyEnv) -> None:
    # 6000 N on 58 kg for 0.02 s is 2.069 m/s; damping 5 keeps 90% of it.
    obs = observations(run(env, [1, 0, 0, 0, 0, 0, 0, 0], 1))[0]
    assert obs[3] == pytest.approx(1.862, abs=2e-3)
    assert obs[4] == 0.0
    # Player 2's force is negated: +1 moves it toward -x in the world.
    obs = observations(run(env, [0, 0, 0, 0, 1, -1, 0, 0], 1))[0]
    assert obs[9] == pytest.approx(-1.862, abs=2e-3)
    assert obs[10] == pytest.approx(1.862, abs=2e-3)


def test_speed_limit(env: HockeyEnv) -> None:
    obs = observations(run(env, [0, 1, 0, 0, 0, 0, 0, 0], 40))
    speed = np.hypot(obs[:, 3], obs[:, 4])
    assert speed.max() == pytest.approx(10.6, abs=0.05)


@pytest.mark.parametrize(
    ("start_x", "closest"), [(-3.0, -0.4260), (-2.3, -0.3715), (-1.6, -0.4023), (-1.1, -0.4360)]
)
def test_centre_line_bounces_players_back(env: HockeyEnv, start_x: float, closest: float) -> None:
    state = make_state(p1=(start_x, 0, 0, 0, 0, 0), p2=(-start_x, 0, 0, 0, 0, 0))
    obs = observations(run(env, [1, 0, 0, 0, 1, 0, 0, 0], 120, state))
    # Past 0.5 m before the line a braking spring takes over the x-force: the player stops short of the line
    # (how far depends on its speed when it enters the zone) and never crosses ~0.28 m.
    assert obs[:, 0].max() == pytest.approx(closest, abs=0.002)
    assert obs[:, 6].min() == pytest.approx(-closest, abs=0.002)
    # Then it keeps bouncing in a narrow band of the zone.
    assert obs[-30:, 0].min() == pytest.approx(-0.5057, abs=0.001)
    assert obs[-30:, 0].max() == pytest.approx(-0.4707, abs=0.001)


def test_rink_limits(env: HockeyEnv) -> None:
    obs = observations(run(env, [-1, 0, 0, 0, -1, 0, 0, 0], 150))
    # Force toward the own goal stops at x = 1.5 (world) but the momentum carries ~0.15 m further.
    assert obs[:, 0].min() == pytest.approx(-3.648, abs=0.005)
    assert obs[:, 6].max() == pytest.approx(3.648, abs=0.005)
    obs = observations(run(env, [0, 1, 0, 0, 0, 1, 0, 0], 150))
    assert obs[:, 1].max() == pytest.approx(2.912, abs=0.005)
    assert obs[:, 7].min() == pytest.approx(-2.912, abs=0.005)
    obs = observations(run(env, [0, -1, 0, 0, 0, -1, 0, 0], 150))
    assert obs[:, 1].min() == pytest.approx(-2.912, abs=0.005)
    # Still pushing outward, a player rests where the overshoot ended (its velocity there is zeroed).
    assert np.ptp(obs[-20:, 1]) < 1e-4


@pytest.mark.parametrize(
    ("p1", "action", "index", "inside"),
    [
        ((-3.49, 0, 0, -2, 0, 0), [-1, 0], 3, True),  # x limit of player 1 at world 1.5
        ((-3.51, 0, 0, -2, 0, 0), [-1, 0], 3, False),
        ((-3, -2.79, 0, 0, -2, 0), [0, -1], 4, True),  # y limits at world 1.2 and 6.8
        ((-3, -2.81, 0, 0, -2, 0), [0, -1], 4, False),
        ((-3, 2.79, 0, 0, 2, 0), [0, 1], 4, True),
        ((-3, 2.81, 0, 0, 2, 0), [0, 1], 4, False),
    ],
)
def test_limits_stop_outward_pushes(
    env: HockeyEnv, p1: tuple[float, ...], action: list[float], index: int, inside: bool
) -> None:
    obs = observations(run(env, [*action, 0, 0, 0, 0, 0, 0], 1, make_state(p1=p1)))[0]
    if inside:  # the push adds 2.07 m/s, then damping 5 keeps 90%
        assert abs(obs[index]) == pytest.approx((2.0 + 2.069) * 0.9, abs=0.01)
    else:  # past the limit the outward velocity is zeroed and the push cancelled
        assert obs[index] == 0.0


def test_player_two_limits_are_mirrored(env: HockeyEnv) -> None:
    obs = observations(run(env, [0, 0, 0, 0, -1, 0, 0, 0], 1, make_state(p2=(3.51, 0, 0, 2, 0, 0))))[0]
    assert obs[9] == 0.0
    obs = observations(run(env, [0, 0, 0, 0, -1, 0, 0, 0], 1, make_state(p2=(3.49, 0, 0, 2, 0, 0))))[0]
    assert obs[9] == pytest.approx((2.0 + 2.069) * 0.9, abs=0.01)


def test_puck_bounces_off_walls_with_restitution(env: HockeyEnv) -> None:
    # Straight down onto the bottom wall at 10 m/s: back up at 0.95 of the speed (minus damping).
    trace = run(env, np.zeros(8), 30, make_state(puck=(0.5, -2.0, 0.0, -10.0)))
    vy = observations(trace)[:, 15]
    up = vy[vy > 0]
    assert up[0] == pytest.approx(10.0 * 0.95, rel=0.01)


def test_rotation_limit(env: HockeyEnv) -> None:
    obs = observations(run(env, [0, 0, 1, 0, 0, 0, -1, 0], 100))
    # Torque works only within +-pi/3; past it a restoring torque pulls back: overshoot to ~1.148 rad.
    assert obs[:, 2].max() == pytest.approx(1.148, abs=0.005)
    assert obs[:, 8].min() == pytest.approx(-1.148, abs=0.005)
    # Held there, it hovers around the limit.
    assert obs[-20:, 2] == pytest.approx(np.full(20, C.MAX_ANGLE), abs=0.1)


def test_free_shot_decays_to_the_puck_speed_limit() -> None:
    env = HockeyEnv(mode=Mode.TRAIN_DEFENSE)
    env.reset(seed=3)
    speeds = []
    for _ in range(7):
        obs, *_ = env.step(np.zeros(8, dtype=np.float32))
        speeds.append(math.hypot(obs[14], obs[15]))
    # 60 m/s with damping 0.05 (x0.999), then damping 10 (x0.8) while above 25 m/s, then 0.05 again.
    expected = [59.94, 47.952, 38.362, 30.689, 24.551, 24.527, 24.503]
    np.testing.assert_allclose(speeds, expected, rtol=1e-3)


def catch_trace(env: HockeyEnv, shoot_at: int | None, steps: int):
    # Player 1 nudges a resting puck that lies just in front of its face.
    state = make_state(puck=(-2.66, 0, 0, 0))
    env.reset(seed=0)
    env.set_state(state)
    trace = []
    for t in range(steps):
        a = np.zeros(8, dtype=np.float32)
        a[0] = 0.3 if t < 2 else 0.0
        a[3] = 1.0 if t == shoot_at else 0.0
        trace.append(env.step(a))
    return trace


def test_puck_hold_counter_and_auto_release(env: HockeyEnv) -> None:
    trace = catch_trace(env, None, 20)
    holds = [int(t[0][16]) for t in trace]
    catch = holds.index(15)
    assert trace[catch][4]["reward_touch_puck"] == 1.0
    assert all(t[4]["reward_touch_puck"] == 0.0 for i, t in enumerate(trace) if i != catch)
    assert holds[catch : catch + 14] == list(range(15, 1, -1))
    # Released on the 14th step after the catch, with a 60 m/s shot along the racket (angle 0: +x).
    release = catch + 14
    assert holds[release] == 0
    before, after = trace[release - 1][0], trace[release][0]
    assert after[14] == pytest.approx((before[3] + 60.0) * 0.999, abs=0.02)
    # While held, the puck rides ~0.314 m in front of the racket's origin with the racket's velocity.
    for obs, *_ in trace[catch + 1 : release]:
        assert obs[12] - obs[0] == pytest.approx(0.314, abs=0.005)
        assert obs[14] == pytest.approx(obs[3], rel=0.15)


def test_shoot_action_releases_with_sixty_metres_per_second(env: HockeyEnv) -> None:
    trace = catch_trace(env, 3, 8)
    holds = [int(t[0][16]) for t in trace]
    assert holds[2] == 15 and holds[3] == 0
    before, after = trace[2][0], trace[3][0]
    assert after[14] == pytest.approx((before[3] + 60.0) * 0.999, abs=0.02)
    # Then the speed limit's damping: x0.8 per step while above 25 m/s.
    assert trace[4][0][14] == pytest.approx(after[14] * 0.8, rel=1e-3)


def test_goal_right_player_one_scores(env: HockeyEnv) -> None:
    state = make_state(p2=(3, 2.5, 0, 0, 0, 0), puck=(3.3, 0.0, 10.0, 0.0))
    trace = run(env, np.zeros(8), 6, state)
    obs, reward, terminated, truncated, info = trace[-1]
    assert terminated and not truncated and info["winner"] == 1
    assert reward == pytest.approx(10.0)  # the puck is in player 2's half: no closeness term
    assert env.get_info_agent_two()["winner"] == -1
    info_two = env.get_info_agent_two()
    dist = math.hypot(obs[6] - obs[12], obs[7] - obs[13])
    assert info_two["reward_closeness_to_puck"] == pytest.approx(-dist * 30 / (250 / 60 * 125), abs=1e-6)
    assert env.get_reward_agent_two(info_two) == pytest.approx(-10.0 + info_two["reward_closeness_to_puck"])


def test_goal_left_player_two_scores(env: HockeyEnv) -> None:
    state = make_state(p1=(-3, 2.5, 0, 0, 0, 0), puck=(-3.3, 0.0, -10.0, 0.0))
    trace = run(env, np.zeros(8), 6, state)
    obs, reward, _, _, info = next(t for t in trace if t[2])
    assert info["winner"] == -1
    dist = math.hypot(obs[0] - obs[12], obs[1] - obs[13])
    assert reward == pytest.approx(-10.0 - dist * 30 / (250 / 60 * 125), abs=1e-6)


@pytest.mark.parametrize(("gap", "scores"), [(0.012, False), (0.008, True)])
def test_goal_sensor_edge(env: HockeyEnv, gap: float, scores: bool) -> None:
    # The left sensor's rink-side face is at world x = 0.9167; Box2D polygons carry a 0.01 m skin, so a
    # resting puck scores once its edge is within 0.01 m of that face.
    x = 0.75 + 10 / 60 + C.PUCK_RADIUS + gap - C.CENTER_X
    trace = run(env, np.zeros(8), 3, make_state(puck=(x, 0.0, 0.0, 0.0)))
    assert any(t[2] for t in trace) is scores


def test_no_goal_outside_the_mouth(env: HockeyEnv) -> None:
    # A puck driven at the side wall beside the mouth bounces back.
    trace = run(env, np.zeros(8), 10, make_state(p1=(-3, 2.5, 0, 0, 0, 0), puck=(-3.0, -2.0, -15.0, 0.0)))
    assert not any(t[2] for t in trace)
    assert trace[-1][0][14] > 0


def test_no_catch_when_the_puck_moves_away(env: HockeyEnv) -> None:
    # Player 1 runs into a puck that already moves away from it: a bump, not a catch.
    trace = run(env, np.zeros(8), 10, make_state(p1=(-3, 0, 0, 5, 0, 0), puck=(-2.5, 0, 0.5, 0)))
    obs = observations(trace)
    assert not obs[:, 16].any()
    assert obs[-1, 14] > 1.0


def test_keep_mode_off_never_catches() -> None:
    env = HockeyEnv(keep_mode=False)
    trace = catch_trace(env, None, 10)
    assert all(t[0][16] == 0 and t[0][17] == 0 for t in trace)
    assert trace[-1][0].shape == (18,)


def test_mirrored_state_gives_mirrored_observation() -> None:
    a, b = HockeyEnv(), HockeyEnv()
    a.reset(seed=0)
    b.reset(seed=0)
    state = make_state(
        p1=(-2.2, 0.7, 0.3, 1.5, -0.8, 0.4), p2=(1.7, -1.1, -0.2, -2.0, 1.0, -0.6), puck=(-1.0, 1.2, -3, 2)
    )
    a.set_state(state)
    b.set_state(mirror_observation(state.astype(np.float32)))
    np.testing.assert_allclose(mirror_observation(b.obs_agent_two()), a.obs_agent_two(), atol=1e-6)
    rng = np.random.default_rng(0)
    for _ in range(30):
        a1, a2 = rng.uniform(-1, 1, 4), rng.uniform(-1, 1, 4)
        a1[3] = a2[3] = 0.0
        a.step(np.concatenate([a1, a2]).astype(np.float32))
        obs_b, r_b, _, _, info_b = b.step(np.concatenate([a2, a1]).astype(np.float32))
        # Game B is game A turned by 180 degrees: B's player 1 sees what A's player 2 sees.
        np.testing.assert_allclose(obs_b, a.obs_agent_two(), atol=2e-4)
        info_two = a.get_info_agent_two()
        assert info_b["reward_closeness_to_puck"] == pytest.approx(
            info_two["reward_closeness_to_puck"], abs=1e-4
        )
        assert r_b == pytest.approx(a.get_reward_agent_two(info_two), abs=1e-4)


def test_obs_agent_two_is_the_exact_mirror() -> None:
    env = HockeyEnv()
    obs, _ = env.reset(seed=5)
    rng = np.random.default_rng(1)
    for _ in range(60):
        obs, *_ = env.step(rng.uniform(-1, 1, 8).astype(np.float32))
        two = env.obs_agent_two()
        assert two.dtype == np.float32
        np.testing.assert_array_equal(two, mirror_observation(obs))
        np.testing.assert_array_equal(mirror_observation(two), obs)
    # Angles keep their sign, positions and velocities flip, counters swap.
    assert two[2] == obs[8] and two[0] == -obs[6] and two[16] == obs[17]
