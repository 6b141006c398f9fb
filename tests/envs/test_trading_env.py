"""The trading env: a split by date with no look-ahead, wealth and rewards from the prices with costs,
deterministic held-out episodes, both action types, and the registered ids through the env factory."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_lightning.envs import EnvConfig, make_env, trading
from rl_lightning.envs.trading import TradingEnv, load_prices

pytest.importorskip("gym_anytrading", reason="the trading envs read gym-anytrading's bundled data")

COST = 0.001


def env(split: str = "train", **kw) -> TradingEnv:
    return TradingEnv(split=split, transaction_cost=COST, **kw)


def test_the_bundled_series_load_oldest_first() -> None:
    series = [("STOCKS_GOOGL", "2009-05-22", "2018-08-29"), ("FOREX_EURUSD_1H_ASK", "2017-01", "2017-12"),
              ("INDEX_NASDAQ", "1999-01-04", "2018-12-31")]  # fmt: skip
    for name, first, last in series:
        dates, prices = load_prices(name)
        assert (np.diff(dates) > np.timedelta64(0, "s")).all() and (prices > 0).all()
        assert str(dates[0]).startswith(first) and str(dates[-1]).startswith(last)


def test_periods_split_by_date_without_overlap() -> None:
    e = env()
    (_, b), (c, d), (f, g) = (e.period(s) for s in ("train", "validation", "test"))
    assert b + 1 == c and d + 1 == f and g == len(e.prices) - 1
    assert e.dates[b] < np.datetime64("2016-01-01") <= e.dates[c]
    assert e.dates[d] < np.datetime64("2017-01-01") <= e.dates[f]
    nasdaq = env(dataset="INDEX_NASDAQ")  # the second series: the same dates, from 1999 to the end of 2018
    (a, b), (c, d), (f, g) = (nasdaq.period(s) for s in ("train", "validation", "test"))
    assert str(nasdaq.dates[f]).startswith("2017-01-03") and str(nasdaq.dates[g]).startswith("2018-12-31")
    assert nasdaq.dates[b] < np.datetime64("2016-01-01") <= nasdaq.dates[c] and a > 0


def test_train_episodes_never_reach_past_the_train_period() -> None:
    e = env(episode_length=250)
    last_train = e.period("train")[1]
    for seed in range(30):
        e.reset(seed=seed)
        start, steps, truncated = e._t, 0, False
        while not truncated:
            *_, truncated, _ = e.step(np.array([1.0]))
            steps += 1
            assert e._t <= last_train  # the return of the last step ends at a train-period close
        assert steps == 250 and start >= e.window_size


def test_observation_is_scaled_past_returns_and_the_position_without_look_ahead() -> None:
    e = env("test")
    obs, _ = e.reset(seed=0)
    t = e._t
    logret = np.log(e.prices[t - e.window_size + 1 : t + 1] / e.prices[t - e.window_size : t])
    assert obs.shape == (e.window_size + 1,) and obs[-1] == 0.0
    ratio = obs[:-1] / logret
    assert np.allclose(ratio[np.abs(logret) > 1e-6], ratio[np.abs(logret) > 1e-6][0], rtol=1e-4)
    obs2, *_ = e.step(np.array([0.5]))
    assert obs2[-1] == 0.5
    # The future does not move the observation: the same env with the later prices scrambled.
    f = env("test")
    f.features = f.features.copy()
    f.features[t + 2 :] = 0.0
    obs_f, _ = f.reset(seed=0)
    assert np.array_equal(obs_f, obs) and np.array_equal(f.step(np.array([0.5]))[0], obs2)


def test_trend_features_are_past_log_returns_over_each_horizon_in_units_of_their_noise() -> None:
    e = env("test", window_size=5, trend_windows=(20, 250))
    obs, _ = e.reset(seed=0)
    t, logp = e._t, np.log(e.prices)
    sigma = np.diff(logp)[: e.i_val - 1].std()  # the train period's daily log returns
    assert obs.shape == (5 + 2 + 1,) == e.observation_space.shape
    for feature, n in zip(obs[5:7], (20, 250), strict=True):
        trend = (logp[t] - logp[t - n]) / (sigma * np.sqrt(n))
        assert feature == pytest.approx(np.clip(trend, -5, 5), rel=1e-5)
    train = env(window_size=5, trend_windows=(250,))
    assert train.period("train")[0] == 250  # a train episode starts where the longest horizon is defined
    with pytest.raises(ValueError, match="trend_windows"):
        env(trend_windows=(0,))


def test_rewards_are_log_wealth_growth_with_costs_on_position_changes() -> None:
    e = env("test", reward_scale=100.0)
    e.reset(seed=0)
    t0 = e._t
    positions = [1.0, 1.0, -1.0, 0.0, 0.25]
    rewards, prev = [], 0.0
    for i, p in enumerate(positions):
        _, r, terminated, _, info = e.step(np.array([p]))
        asset = e.prices[t0 + i + 1] / e.prices[t0 + i] - 1
        growth = 1 + p * asset - COST * abs(p - prev)
        assert r == pytest.approx(100 * np.log(growth), rel=1e-9, abs=1e-12)
        assert info["asset_return"] == pytest.approx(asset) and not terminated
        rewards.append(r)
        prev = p
    assert info["wealth"] == pytest.approx(np.exp(sum(rewards) / 100))


def assert_positions_and_wealth(e: TradingEnv, targets: list[float], expected: list[float]) -> None:
    """Steps ``e`` from a reset with each target and checks the position it takes and the wealth it pays for:
    the asset's move on the position, less the cost of what moved."""
    e.reset(seed=0)
    t0, wealth, prev = e._t, 1.0, 0.0
    for i, (a, p) in enumerate(zip(targets, expected, strict=True)):
        info = e.step(np.array([a]))[4]
        asset = e.prices[t0 + i + 1] / e.prices[t0 + i] - 1
        wealth *= 1 + p * asset - COST * abs(p - prev)
        assert info["position"] == pytest.approx(p) and info["wealth"] == pytest.approx(wealth)
        prev = p


def test_a_bounded_change_moves_the_position_toward_the_target_and_costs_only_what_moved() -> None:
    # Target long from flat: four steps of 0.25; then short: 0.75, 0.5; then a target within reach.
    targets = [1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, 0.6]
    expected = [0.25, 0.5, 0.75, 1.0, 1.0, 0.75, 0.5, 0.6]
    assert_positions_and_wealth(env("test", max_position_change=0.25), targets, expected)
    d = env("test", action_type="discrete", max_position_change=0.5)
    d.reset(seed=0)
    assert [d.step(np.int64(2))[4]["position"] for _ in range(3)] == [0.5, 1.0, 1.0]


def test_a_no_trade_band_holds_the_position_until_the_target_leaves_it_then_trades_to_its_edge() -> None:
    # From flat: a target of 0.2 is inside the band (no trade); 1.0 moves to 0.75, the band's near edge;
    # targets jittering in [0.5, 1.0] then trade nothing; -1.0 moves to -0.75.
    targets = [0.2, 1.0, 0.9, 0.6, 0.5, 1.0, -1.0]
    expected = [0.0, 0.75, 0.75, 0.75, 0.75, 0.75, -0.75]
    assert_positions_and_wealth(env("test", no_trade_band=0.25), targets, expected)
    # With a bounded change too, the band's edge is where the position heads: 0.1 a step toward 0.75.
    both = env("test", no_trade_band=0.25, max_position_change=0.1)
    both.reset(seed=0)
    assert [round(both.step(np.array([1.0]))[4]["position"], 6) for _ in range(9)] == [
        0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.75
    ]  # fmt: skip


def test_the_turnover_penalty_lowers_the_reward_by_its_share_of_the_change_but_not_the_wealth() -> None:
    plain, shaped = env("test"), env("test", turnover_penalty=0.002)
    for e in (plain, shaped):
        e.reset(seed=0)
    for a in [1.0, 1.0, -0.5, 0.0]:
        _, r0, _, _, i0 = plain.step(np.array([a]))
        change = abs(a - shaped._position)
        _, r1, _, _, i1 = shaped.step(np.array([a]))
        assert r1 == pytest.approx(r0 - 100 * 0.002 * change, abs=1e-12)
        assert i1["wealth"] == i0["wealth"]


def test_held_out_episode_is_the_whole_test_period_and_buy_and_hold_earns_its_price_change() -> None:
    for _ in range(2):  # the same episode every time, whatever the seed
        e = env("test")
        e.reset(seed=np.random.randint(1000))
        first, last = e.period("test")
        steps, truncated = 0, False
        while not truncated:
            *_, truncated, info = e.step(np.array([1.0]))
            steps += 1
        assert steps == last - first + 1
        # The cost of entering is paid on the first day's growth: (1 + r_1 - c) x the rest of the move.
        p = e.prices
        assert info["wealth"] == pytest.approx((p[first] / p[first - 1] - COST) * p[last] / p[first])


def test_discrete_actions_are_short_flat_long() -> None:
    e = env("test", action_type="discrete")
    assert e.action_space == gym.spaces.Discrete(3)
    e.reset(seed=0)
    for a, p in [(2, 1.0), (1, 0.0), (0, -1.0)]:
        assert e.step(np.int64(a))[4]["position"] == p


def test_rejects_bad_arguments_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="split"):
        env("future")
    with pytest.raises(ValueError, match="validation_date"):
        env(validation_date="2019-01-01", test_date="2020-01-01")
    with pytest.raises(ValueError, match="max_position_change"):
        env(max_position_change=0.0)
    with pytest.raises(ValueError, match="turnover_penalty"):
        env(turnover_penalty=-0.1)
    with pytest.raises(ValueError, match="no_trade_band"):
        env(no_trade_band=-0.1)
    monkeypatch.setattr(trading.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="rl_lightning\\[trading\\]"):
        load_prices("STOCKS_GOOGL")


@pytest.mark.parametrize("env_id", ["TradingStocks-v0", "TradingForex-v0"])
def test_registered_ids_run_through_the_env_factory(env_id: str) -> None:
    torch_env = make_env(EnvConfig(id=env_id, num_envs=2, kwargs={"split": "validation"}), seed=0)
    td = torch_env.rollout(5, break_when_any_done=False)
    assert td["observation"].shape[:2] == (2, 5) and td["action"].shape[-1] == 1
    assert torch.isfinite(td["next", "reward"]).all()
    torch_env.close()
