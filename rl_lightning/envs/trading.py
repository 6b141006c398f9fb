"""A trading env on real market prices: series that Python packages ship, split by date, with trading costs.

The prices come from CSV files bundled with two packages (the optional extra
``pip install rl_lightning[trading]``): ``gym-anytrading``'s ``STOCKS_GOOGL`` (Alphabet daily closes,
2009-05-22 to 2018-08-29) and ``FOREX_EURUSD_1H_ASK`` (EUR/USD hourly ask closes, 2017), and ``arch``'s
``INDEX_NASDAQ`` (the NASDAQ Composite's daily closes, 1999-01-04 to 2018-12-31; a second series whose
test period no choice of a recipe looked at). Only their data files are read (located without importing
the packages, parsed with the standard library): the env itself is ours.

Gymnasium ids (registered by :func:`register_trading_envs`, which ``rl_lightning.envs`` calls; nothing
is read before an env is made):

* ``TradingStocks-v0``: GOOGL daily; train before 2016-01-01, validation 2016, test from 2017-01-01
  (``dataset=INDEX_NASDAQ``: the NASDAQ Composite on the same dates).
* ``TradingForex-v0``: EUR/USD hourly; train before 2017-09-01, validation September 2017, test from
  2017-10-01.

**Dynamics.** At the close of step ``t`` the agent sets its position ``p_t`` in ``[-1, 1]`` (short to
long, a fraction of its wealth) and holds it to the next close. The wealth grows by
``1 + p_t r_{t+1} - c |p_t - p_{t-1}|`` with ``r_{t+1} = P_{t+1}/P_t - 1`` the asset's simple return and
``c`` the transaction cost per unit of position changed. The reward is ``scale`` times the log of that
growth, so an episode's return is ``scale × log(final wealth / initial wealth)`` (with ``scale = 100``:
the log-return in percent). Episodes start flat (``p = 0``).

**Turnover control** (all off by default). With ``no_trade_band`` ``b`` the position only moves when the
target is more than ``b`` away, and then only to the band's edge: ``p_t = clip(p_{t-1}, a - b, a + b)`` for a
target ``a`` (under proportional costs the optimal policy has this form, a no-trade region around the
frictionless target: Davis and Norman 1990); a target that jitters within the band trades nothing. With
``max_position_change`` the position then moves toward that point by at most that much per step (a bounded
daily change: at ``0.1`` a full switch from flat to long takes ten days and costs at most ``0.1 c`` a day).
With ``turnover_penalty`` ``λ`` the reward is ``scale × (log growth - λ |p_t - p_{t-1}|)``: a shaping term on
top of the costs already in the growth, for training (an evaluation variant sets it to 0, so its return stays
the log of wealth; the wealth never pays it).

**Splits** (by date, deterministic): ``train`` episodes are ``episode_length`` steps from a random start
inside the train period; ``validation`` and ``test`` are one episode each, the whole period from its
first day, the same every time. The observation window may reach back across the split date (past
prices only: no look-ahead).

**Actions**: ``continuous`` (a ``Box(-1, 1, (1,))`` target position) or ``discrete`` (``0, 1, 2`` =
short, flat, long). **Observation**: the last ``window_size`` log returns divided by their standard
deviation ``σ`` over the train period (clipped to ±5); then, for each ``n`` of ``trend_windows``, the log
return over the last ``n`` steps divided by ``σ √n`` (the trend at that scale in units of its noise, clipped
to ±5); then the current position: ``window_size + len(trend_windows) + 1`` floats.
``info`` holds ``position``, ``asset_return`` (``r_{t+1}``) and ``wealth``.
"""

from __future__ import annotations

import csv
import datetime as dt
import gzip
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from rl_lightning.envs.state import from_plain, to_plain

__all__ = ["DATASETS", "TRADING_ENV_IDS", "TradingEnv", "load_prices", "register_trading_envs"]

#: Bundled series: the package that ships it, its file in the package, date column, date format.
DATASETS = {
    "STOCKS_GOOGL": ("gym_anytrading", "datasets/data/STOCKS_GOOGL.csv", "Date", "%Y-%m-%d"),
    "FOREX_EURUSD_1H_ASK": (
        "gym_anytrading",
        "datasets/data/FOREX_EURUSD_1H_ASK.csv",
        "Time",
        "%d.%m.%Y %H:%M:%S.%f",
    ),
    "INDEX_NASDAQ": ("arch", "data/nasdaq/nasdaq.csv.gz", "Date", "%m/%d/%Y"),
}

#: id -> default kwargs.
TRADING_ENV_IDS: dict[str, dict[str, Any]] = {
    "TradingStocks-v0": {
        "dataset": "STOCKS_GOOGL",
        "validation_date": "2016-01-01",
        "test_date": "2017-01-01",
        "episode_length": 250,
        "window_size": 30,
    },
    "TradingForex-v0": {
        "dataset": "FOREX_EURUSD_1H_ASK",
        "validation_date": "2017-09-01",
        "test_date": "2017-10-01",
        "episode_length": 500,
        "window_size": 48,
    },
}

SPLITS = ("train", "validation", "test")


def _data_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the trading envs read price series bundled with {package.replace('_', '-')}: "
            "pip install 'rl_lightning[trading]'."
        )
    return Path(next(iter(spec.submodule_search_locations))) / relative


def load_prices(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """The dates (``datetime64[s]``) and closing prices (float64) of a bundled series, oldest first."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset={dataset!r}: use one of {sorted(DATASETS)}.")
    package, relative, date_col, fmt = DATASETS[dataset]
    path = _data_file(package, relative)
    with gzip.open(path, "rt", newline="") if path.suffix == ".gz" else path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    dates = np.array([np.datetime64(dt.datetime.strptime(r[date_col], fmt), "s") for r in rows])
    close = np.array([float(r["Close"]) for r in rows], dtype=np.float64)
    order = np.argsort(dates, kind="stable")
    return dates[order], close[order]


class TradingEnv(gym.Env):
    """One asset, one position in ``[-1, 1]``, daily or hourly steps; see the module docstring.

    Args:
        dataset: ``STOCKS_GOOGL``, ``FOREX_EURUSD_1H_ASK`` or ``INDEX_NASDAQ``.
        split: ``train``, ``validation`` or ``test``.
        validation_date: first date of the validation period (ISO, ``YYYY-MM-DD``).
        test_date: first date of the test period.
        episode_length: steps of a train episode (validation and test run their whole period).
        window_size: past log returns in the observation.
        trend_windows: horizons ``n`` (steps) of the trend features (the log return over the last ``n``).
        transaction_cost: cost per unit of position changed, a fraction of wealth (0.001 = 10 bp).
        reward_scale: the reward is ``reward_scale × log(wealth growth)``.
        action_type: ``continuous`` (target position) or ``discrete`` (short, flat, long).
        no_trade_band: ``b``, the half-width of the no-trade region around the target (0: none).
        max_position_change: the largest change of position per step (``None``: any, the target is taken).
        turnover_penalty: ``λ``, subtracted per unit of position changed from the log growth in the reward.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        dataset: str = "STOCKS_GOOGL",
        split: str = "train",
        validation_date: str = "2016-01-01",
        test_date: str = "2017-01-01",
        episode_length: int = 250,
        window_size: int = 30,
        trend_windows: Sequence[int] = (),
        transaction_cost: float = 0.001,
        reward_scale: float = 100.0,
        action_type: str = "continuous",
        no_trade_band: float = 0.0,
        max_position_change: float | None = None,
        turnover_penalty: float = 0.0,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split={split!r}: use one of {SPLITS}.")
        if action_type not in ("continuous", "discrete"):
            raise ValueError(f"action_type={action_type!r}: use continuous or discrete.")
        if transaction_cost < 0 or window_size < 1 or episode_length < 1:
            raise ValueError("transaction_cost >= 0, window_size >= 1 and episode_length >= 1 are required.")
        trend_windows = tuple(int(n) for n in trend_windows)
        if any(n < 1 for n in trend_windows):
            raise ValueError(f"trend_windows={list(trend_windows)}: every horizon must be >= 1 step.")
        if max_position_change is not None and not 0 < max_position_change <= 2:
            raise ValueError(f"max_position_change={max_position_change}: use a value in (0, 2] or null.")
        if not 0 <= no_trade_band < 2:
            raise ValueError(f"no_trade_band={no_trade_band}: use a value in [0, 2).")
        if turnover_penalty < 0:
            raise ValueError(f"turnover_penalty={turnover_penalty}: use a value >= 0.")
        dates, prices = load_prices(dataset)
        val, test = np.datetime64(validation_date, "s"), np.datetime64(test_date, "s")
        if not dates[0] < val < test < dates[-1]:
            raise ValueError(f"need {dates[0]} < validation_date < test_date < {dates[-1]}.")
        self.dates, self.prices = dates, prices
        log_ret = np.diff(np.log(prices), prepend=np.log(prices[0]))
        self.i_val, self.i_test = int(np.searchsorted(dates, val)), int(np.searchsorted(dates, test))
        # The first close with every feature defined: a train episode starts no earlier.
        self.lookback = max((window_size, *trend_windows))
        if self.i_val - self.lookback - 1 < episode_length:
            raise ValueError("the train period is shorter than the lookback + episode_length steps.")
        # Scaled by the train period's volatility only: nothing of the later periods leaks into it.
        scale = log_ret[1 : self.i_val].std()
        self.features = np.clip(log_ret / scale, -5.0, 5.0).astype(np.float32)
        self.split, self.window_size, self.episode_length = split, window_size, episode_length
        self.trend_windows, self._log_prices, self._scale = trend_windows, np.log(prices), scale
        self.transaction_cost, self.reward_scale = transaction_cost, reward_scale
        self.max_position_change, self.turnover_penalty = max_position_change, turnover_penalty
        self.no_trade_band = no_trade_band
        self.discrete = action_type == "discrete"
        self.action_space = (
            gym.spaces.Discrete(3) if self.discrete else gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)
        )
        size = window_size + len(trend_windows) + 1
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (size,), dtype=np.float32)
        self._t = self._end = 0
        self._position = self._wealth = 0.0

    def period(self, split: str | None = None) -> tuple[int, int]:
        """The index range ``[first, last]`` of a split's closes (an episode steps from first to last)."""
        split = split or self.split
        if split == "train":
            return self.lookback, self.i_val - 1
        if split == "validation":
            return self.i_val, self.i_test - 1
        return self.i_test, len(self.prices) - 1

    def _obs(self) -> np.ndarray:
        window = self.features[self._t - self.window_size + 1 : self._t + 1]
        trends = [
            (self._log_prices[self._t] - self._log_prices[self._t - n]) / (self._scale * np.sqrt(n))
            for n in self.trend_windows
        ]
        return np.concatenate([window, np.clip(trends, -5.0, 5.0), [self._position]]).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        first, last = self.period()
        if self.split == "train":
            first = int(self.np_random.integers(first, last - self.episode_length + 1))
            last = first + self.episode_length
        # A validation/test episode starts at the close before its period, so it earns every return in it.
        self._t, self._end = (first - 1, last) if self.split != "train" else (first, last)
        self._position, self._wealth = 0.0, 1.0
        return self._obs(), {"position": 0.0, "asset_return": 0.0, "wealth": 1.0}

    def get_env_state(self) -> dict[str, Any]:
        """The episode's position in the prices, the held position, the wealth and the generator, as plain
        values: what a checkpoint keeps of a training env (:mod:`rl_lightning.envs.state`)."""
        values = (self._t, self._end, self._position, self._wealth)  # NumPy scalars among them stay so
        return {"values": to_plain(values), "np_random": self.np_random.bit_generator.state}

    def set_env_state(self, state: dict[str, Any]) -> None:
        """Restores what :meth:`get_env_state` returned."""
        self._t, self._end, self._position, self._wealth = from_plain(state["values"])
        self.np_random.bit_generator.state = state["np_random"]

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.discrete:
            target = float(int(np.asarray(action).reshape(())) - 1)
        else:
            target = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        band = self.no_trade_band
        position = min(max(self._position, target - band), target + band) if band > 0 else target
        if self.max_position_change is not None:
            bound = self.max_position_change
            position = self._position + float(np.clip(position - self._position, -bound, bound))
        change = abs(position - self._position)
        asset_return = self.prices[self._t + 1] / self.prices[self._t] - 1.0
        growth = 1.0 + position * asset_return - self.transaction_cost * change
        growth = max(growth, 1e-6)  # a position of at most 1x cannot lose more than everything
        self._wealth *= growth
        self._position = position
        self._t += 1
        info = {"position": position, "asset_return": asset_return, "wealth": self._wealth}
        reward = self.reward_scale * (np.log(growth) - self.turnover_penalty * change)
        return self._obs(), float(reward), False, self._t >= self._end, info


def register_trading_envs() -> None:
    """Registers ``TradingStocks-v0`` and ``TradingForex-v0`` (idempotent; reads no data)."""
    for env_id, kwargs in TRADING_ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point="rl_lightning.envs.trading:TradingEnv", kwargs=dict(kwargs))
