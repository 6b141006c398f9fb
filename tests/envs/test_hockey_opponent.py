"""BasicOpponent, the single-agent env against an opponent, and the discrete-action wrapper."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest

from rl_lightning.envs.hockey import (
    DISCRETE_ACTIONS,
    BasicOpponent,
    DiscreteActionWrapper,
    HockeyEnv,
    HockeyVsOpponentEnv,
    discrete_to_continuous,
    make_vs_opponent_discrete,
)


def observation(**values: float) -> np.ndarray:
    names = ["x", "y", "angle", "vx", "vy", "w"]
    obs = np.zeros(18, dtype=np.float32)
    for i, name in enumerate(names):
        obs[i] = values.get(name, 0.0)
    obs[12:18] = [values.get(k, 0.0) for k in ("px", "py", "pvx", "pvy", "hold", "hold2")]
    return obs


@pytest.mark.parametrize(("weak", "kp"), [(True, 0.5), (False, 10.0)])
def test_pd_control_toward_the_kick_point(weak: bool, kp: float) -> None:
    opp = BasicOpponent(weak=weak, seed=0)
    # Behind a resting puck and within 0.5 in y: aim 0.2 past the puck.
    action = opp.act(observation(x=-1.0, y=0.2, px=-0.5, py=0.3))
    assert action.dtype == np.float32 and action.shape == (4,)
    ex, ey = -0.5 + 0.2 - (-1.0), 0.3 - 0.2
    ea = math.pi / 3 * math.sin(opp.phase)
    expected = np.clip([ex * kp, ey * kp / 5, ea * kp / 2], -1, 1)
    np.testing.assert_allclose(action[:3], expected, rtol=1e-6)
    assert action[3] == 0.0


def test_defends_home_when_not_behind_the_puck_or_puck_moves_away() -> None:
    opp = BasicOpponent(weak=True, seed=0)
    # In front of the puck: go back to x = -3.5 at the puck's height.
    a = opp.act(observation(x=-2.5, y=0.0, px=-3.0, py=1.0))
    np.testing.assert_allclose(a[:2], [(-3.5 + 2.5) * 0.5, 1.0 * 0.1], rtol=1e-6)
    # The puck flies away faster than 0.5 m/s: back to the goal centre.
    a = opp.act(observation(x=-2.5, y=1.0, px=2.0, py=-1.0, pvx=3.0))
    np.testing.assert_allclose(a[:2], [(-3.5 + 2.5) * 0.5, -1.0 * 0.1], rtol=1e-6)
    # Slower than 0.5 m/s counts as coming: behind the puck and within 0.5 in y, it goes for the kick.
    a = opp.act(observation(x=-2.5, y=1.0, px=-2.3, py=1.45, pvx=0.45))
    assert a[0] == pytest.approx((-2.3 + 0.2 + 2.5) * 0.5, rel=1e-6)
    a = opp.act(observation(x=-2.5, y=1.0, px=-2.3, py=1.55, pvx=0.45))
    assert a[0] == pytest.approx((-3.5 + 2.5) * 0.5, rel=1e-6)


@pytest.mark.parametrize(("vy", "brakes"), [(1.0, False), (2.2, True)])
def test_kick_leads_a_moving_puck_and_brakes_near_target(vy: float, brakes: bool) -> None:
    opp = BasicOpponent(weak=False, seed=0)
    a = opp.act(observation(x=-1.0, y=0.2, px=-0.5, py=0.3, pvy=2.0, vy=vy))
    # The y target leads the puck by vy * dist * 0.1; within 0.1 s of it (|ey / vy| < 0.1) it brakes (kd 0.5).
    ey = 0.3 + 2.0 * math.hypot(0.5, 0.1) * 0.1 - 0.2
    assert a[1] == pytest.approx(ey * 2.0 - (0.5 * vy if brakes else 0.0), rel=1e-5)
    assert a[0] == 1.0  # strong gain: 0.7 m error saturates


@pytest.mark.parametrize(("hold", "shoots"), [(0, 0.0), (3, 1.0), (6, 1.0), (7, 0.0), (15, 0.0)])
def test_shoots_after_holding_for_a_while(hold: int, shoots: float) -> None:
    assert BasicOpponent(seed=0).act(observation(hold=hold))[3] == shoots


def test_seeded_phase_and_reseeding() -> None:
    a, b = BasicOpponent(seed=3), BasicOpponent(seed=3)
    obs = observation(x=-2.0, px=-1.0)
    seq_a = [a.act(obs) for _ in range(50)]
    seq_b = [b.act(obs) for _ in range(50)]
    np.testing.assert_array_equal(seq_a, seq_b)
    phases = [a.phase]
    for _ in range(200):
        a.act(obs)
        phases.append(a.phase)
    steps = np.diff(phases)
    assert steps.min() >= 0 and steps.max() <= 0.2 and steps.mean() == pytest.approx(0.1, abs=0.01)
    a.seed(3)
    np.testing.assert_array_equal([a.act(obs) for _ in range(50)], seq_a)
    assert not np.array_equal([BasicOpponent(seed=4).act(obs) for _ in range(50)], seq_a)


def play(env: gym.Env, seed: int, steps: int) -> np.ndarray:
    out = [env.reset(seed=seed)[0]]
    rng = np.random.default_rng(0)
    for _ in range(steps):
        obs, reward, terminated, truncated, info = env.step(rng.uniform(-1, 1, 4).astype(np.float32))
        out.append(np.append(obs, [reward, info["winner"]]))
        if terminated or truncated:
            out.append(env.reset()[0])
    return np.concatenate(out)


@pytest.mark.parametrize("opponent", ["weak", "strong", {"weak": 0.5, "strong": 0.5}])
def test_vs_opponent_is_reproducible_from_the_seed(opponent: object) -> None:
    env = HockeyVsOpponentEnv(opponent=opponent)  # type: ignore[arg-type]
    first = play(env, 11, 600)
    np.testing.assert_array_equal(first, play(env, 11, 600))
    np.testing.assert_array_equal(first, play(HockeyVsOpponentEnv(opponent=opponent), 11, 600))  # type: ignore[arg-type]
    assert not np.array_equal(first, play(env, 12, 600))


def test_vs_opponent_equals_two_player_game_with_the_same_opponent() -> None:
    # The env's opponent is a BasicOpponent seeded from a child of the reset seed, fed obs_agent_two().
    single = HockeyVsOpponentEnv(opponent="strong")
    two = HockeyEnv()
    opp = BasicOpponent(weak=False)
    obs_s, _ = single.reset(seed=5)
    obs_t, _ = two.reset(seed=5)
    child = np.random.SeedSequence(5).spawn(1)[0]
    opp.seed(int(child.generate_state(1, dtype=np.uint64)[0]))
    rng = np.random.default_rng(1)
    for _ in range(250):
        a1 = rng.uniform(-1, 1, 4).astype(np.float32)
        a2 = opp.act(two.obs_agent_two())
        obs_s, r_s, term_s, trunc_s, _ = single.step(a1)
        obs_t, r_t, term_t, trunc_t, _ = two.step(np.concatenate([a1, a2]))
        np.testing.assert_array_equal(obs_s, obs_t)
        assert (r_s, term_s, trunc_s) == (r_t, term_t, trunc_t)
        if term_s or trunc_s:
            break


def test_opponent_mix_is_drawn_per_episode() -> None:
    env = HockeyVsOpponentEnv(opponent={"weak": 0.3, "strong": 0.7})
    env.reset(seed=0)
    names = [env.opponent_name]
    names += [(env.reset(), env.opponent_name)[1] for _ in range(400)]
    assert set(names) == {"weak", "strong"}
    assert names.count("weak") / len(names) == pytest.approx(0.3, abs=0.07)
    # Draws come from the env's seeded generator.
    again = HockeyVsOpponentEnv(opponent={"weak": 0.3, "strong": 0.7})
    again.reset(seed=0)
    assert [again.opponent_name] + [(again.reset(), again.opponent_name)[1] for _ in range(400)] == names
    only_strong = HockeyVsOpponentEnv(opponent={"strong": 1.0})
    assert all((only_strong.reset(seed=s), only_strong.opponent_name)[1] == "strong" for s in range(20))


@pytest.mark.parametrize(
    ("opponent", "error"),
    [("medium", ValueError), ({"weak": -1.0}, ValueError), ({"medium": 1.0}, ValueError), (3, TypeError)],
)
def test_bad_opponents_are_rejected(opponent: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        HockeyVsOpponentEnv(opponent=opponent)  # type: ignore[arg-type]


class Recorder:
    """A callable opponent that always pushes toward player 1 and records what it sees."""

    def __init__(self) -> None:
        self.seen: list[np.ndarray] = []
        self.seeds: list[int] = []

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        self.seen.append(obs.copy())
        return np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)

    def seed(self, seed: int) -> None:
        self.seeds.append(seed)


def test_callable_opponent_sees_the_mirrored_observation() -> None:
    policy = Recorder()
    env = HockeyVsOpponentEnv(opponent=policy)
    obs, _ = env.reset(seed=0)
    env.reset(seed=0)
    assert len(policy.seeds) == 2 and policy.seeds[0] == policy.seeds[1]
    expected_view = env.obs_agent_two()
    obs, *_ = env.step(np.zeros(4, dtype=np.float32))
    np.testing.assert_array_equal(policy.seen[0], expected_view)
    # "+x toward the opponent" in player 2's frame moves it toward -x in the world.
    assert obs[9] == pytest.approx(-1.862, abs=2e-3)
    assert env.opponent is policy
    plain = HockeyVsOpponentEnv(opponent=lambda o: np.zeros(4))
    plain.reset(seed=0)
    plain.step(np.zeros(4, dtype=np.float32))


def test_saved_agent_as_opponent_for_self_play() -> None:
    # A BasicOpponent instance is just another callable policy.
    env = HockeyVsOpponentEnv(opponent=BasicOpponent(weak=False, seed=1))
    assert play(env, 2, 50).shape[0] > 0


def test_discrete_codes_and_space() -> None:
    expected = {
        0: [0, 0, 0, 0],
        1: [-1, 0, 0, 0],
        2: [1, 0, 0, 0],
        3: [0, -1, 0, 0],
        4: [0, 1, 0, 0],
        5: [0, 0, -1, 0],
        6: [0, 0, 1, 0],
        7: [0, 0, 0, 1],
    }
    for code, action in expected.items():
        np.testing.assert_array_equal(discrete_to_continuous(code), action)
        np.testing.assert_array_equal(DISCRETE_ACTIONS[code], action)
    env = make_vs_opponent_discrete(opponent="weak")
    assert isinstance(env, DiscreteActionWrapper)
    assert env.action_space == gym.spaces.Discrete(8)
    for bad in (-1, 8):
        with pytest.raises(ValueError):
            env.action(bad)
        with pytest.raises(ValueError):
            discrete_to_continuous(bad)
    env.reset(seed=0)
    obs, *_ = env.step(2)  # x + 1: full force toward the opponent
    assert obs[3] == pytest.approx(1.862, abs=2e-3)
    obs, *_ = env.step(np.int64(0))
    with pytest.raises(ValueError):
        DiscreteActionWrapper(HockeyEnv())
