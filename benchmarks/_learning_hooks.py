"""Evaluations some entries of ``learning.py`` need beyond the return: option usage, hockey outcomes, trading.

A hook reads a finished run (its MLflow store, its checkpoints, the final evaluation ``learning.py`` made)
and adds figures to the seed's record (``per_seed``) and to the entry's summary over its seeds
(``summary``):

- ``options``: the option metrics the updates logged (``options/usage_<k>``, ``options/usage_min``,
  ``options/duration_mean``, ``options/termination_prob[_<k>]``, ``options/entropy_high``): each option's
  usage at the end and its largest over the run (an option whose largest usage is below 5% stayed below 5%
  for the whole run), the terminations at the end, every 10th point of the curves;
- ``hockey``: win, loss and draw rates and the return of the final evaluation, per opponent where the
  experiment evaluates against several (its ``eval.variants``); ``hockey_goals`` also checks them against
  the goals of the shipped SAC agent (``tdmpc2_hockey_goals``: those of the TD-MPC2 agent) on the final
  evaluation's test games;
- ``trading``: the last checkpoint's and ``best.ckpt``'s policies (chosen on the validation year, never on
  the test period) play the test period day by day with their deterministic ``act_eval``: total return,
  annualised Sharpe ratio (daily simple returns, mean / std x sqrt(252), no risk-free rate), maximum
  drawdown, average position and |position|, turnover, the options' shares of the days and their switches;
  buy-and-hold (which pays the cost of entering once), flat (cash), a moving-average crossover and, per
  policy, a constant position at the policy's mean exposure (its average risk without its timing) on the
  same period and cost model, computed by the same env.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rl_lightning.training.mlflow_logger import live_history


@dataclass(frozen=True)
class RunRecord:
    """What a hook may read of one finished seed."""

    workdir: Path  # the run's work directory (the CLI's cwd; its MLflow store)
    summary: dict[str, Any]  # the summary line ``fit`` printed (run_dir, last_ckpt, best_ckpt, best_frames)
    client: Any  # an ``mlflow.MlflowClient`` on the run's store
    run_id: str
    final: dict[str, float] | None  # the final (test) evaluation's figures (None: the entry makes none)

    def checkpoint(self, which: str) -> Path:
        return self.workdir / self.summary[f"{which}_ckpt"]


def history(client: Any, run_id: str, key: str) -> list[list[float]]:
    """``[[frames, value], ...]`` of one metric, sorted by frames (of a resumed run, as it stands)."""
    return [[int(m.step), m.value] for m in live_history(client.get_metric_history(run_id, key))]


def mean_of(values: list[Any]) -> Any:
    """The mean of numbers, or of dicts of them key by key (nested)."""
    if isinstance(values[0], dict):
        return {k: mean_of([v[k] for v in values]) for k in values[0]}
    return float(np.mean(values))


class Hook:
    """Figures of a run beyond what ``learning.py`` reads itself."""

    def per_seed(self, run: RunRecord) -> dict[str, Any]:
        return {}

    def summary(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        return {}


USAGE_FLOOR = 0.05


class Options(Hook):
    """Usage, duration and termination of the options, from the metrics the run logged."""

    def per_seed(self, run: RunRecord) -> dict[str, Any]:
        client, run_id = run.client, run.run_id
        logged = client.get_run(run_id).data.metrics
        usage = {k.removeprefix("options/"): history(client, run_id, k) for k in sorted(logged)
                 if k.startswith("options/usage_")}  # fmt: skip
        per_option = {k: v for k, v in usage.items() if k != "usage_min"}
        betas = {k.removeprefix("options/"): history(client, run_id, k) for k in sorted(logged)
                 if k.startswith("options/termination_prob_")}  # fmt: skip
        duration = history(client, run_id, "options/duration_mean")
        beta = history(client, run_id, "options/termination_prob")
        entropy_high = history(client, run_id, "options/entropy_high")
        usage_min = usage.get("usage_min", [])

        def last(points: list[list[float]]) -> float | None:
            return points[-1][1] if points else None

        return {"options": {
            # An option whose beta ends near 1 is stopped at once whenever it is picked (a low usage learned
            # by the terminations); near 0 it runs until the episode ends.
            "termination_prob_final_per_option": {k: v[-1][1] for k, v in betas.items()},
            "usage_final": {k: v[-1][1] for k, v in per_option.items()},
            "usage_max_over_run": {k: max(x for _, x in v) for k, v in per_option.items()},
            "options_always_below_5pct": [k for k, v in per_option.items()
                                          if max(x for _, x in v) < USAGE_FLOOR],
            "share_of_logs_with_usage_min_below_5pct": (
                sum(x < USAGE_FLOOR for _, x in usage_min) / len(usage_min) if usage_min else None
            ),
            "usage_min_final": last(usage_min),
            "duration_mean_final": last(duration),
            "termination_prob_final": last(beta),
            "entropy_high_final": last(entropy_high),
            # Every 10th log keeps the file readable; the full curves are in the run's MLflow store.
            "curves": {"usage_min": usage_min[::10], "duration_mean": duration[::10],
                       "termination_prob": beta[::10], **{k: v[::10] for k, v in per_option.items()}},
        }}  # fmt: skip

    def summary(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        collapsed = [r["seed"] for r in runs if r["options"]["options_always_below_5pct"]]
        return {"seeds_with_an_option_always_below_5pct": collapsed}


RATES = ("win_rate", "loss_rate", "draw_rate", "return_mean")
#: The shipped SAC hockey agent's goals: against the weak opponent at least 90% wins and at most 5% losses,
#: against the strong one at least 80% wins.
GOALS = {"weak_win": 0.90, "weak_loss_max": 0.05, "strong_win": 0.80}
#: The TD-MPC2 agent's goals (issue 49): at least 80% wins against the weak opponent and 50% against the
#: strong one, over 200 games each.
TDMPC2_GOALS = {"weak_win": 0.80, "strong_win": 0.50}


def outcomes(stats: dict[str, float]) -> dict[str, Any]:
    """Win, loss and draw rates and the return of an evaluation: per opponent (``{"weak": {...}, ...}``)
    where it played several (``eval.variants``), else the rates themselves."""
    opponents = sorted({k.split("/")[0] for k in stats if "/" in k})
    if not opponents:
        return {r: stats[r] for r in RATES}
    return {o: {r: stats[f"{o}/{r}"] for r in RATES} for o in opponents}


def goals_met(rates: dict[str, dict[str, float]], goals: dict[str, float]) -> dict[str, bool]:
    """Each goal of ``goals`` (``<opponent>_win``: a least win rate; ``<opponent>_loss_max``: a largest
    loss rate) and whether ``rates`` meet it."""
    met = {}
    for name, bound in goals.items():
        opponent, kind = name.split("_", 1)
        if kind == "win":
            met[name] = rates[opponent]["win_rate"] >= bound
        elif kind == "loss_max":
            met[name] = rates[opponent]["loss_rate"] <= bound
        else:
            raise ValueError(f"unknown hockey goal {name!r}: expected <opponent>_win or <opponent>_loss_max")
    return met


class HockeyOutcomes(Hook):
    """The final evaluation's outcomes per opponent; with ``goals``, whether they meet the shipped agent's."""

    def __init__(self, goals: dict[str, float] | None = None) -> None:
        self.goals = goals

    def per_seed(self, run: RunRecord) -> dict[str, Any]:
        if run.final is None:
            return {}
        out: dict[str, Any] = {"outcomes": outcomes(run.final)}
        if self.goals:
            out["goals"] = self.goals
            out["goals_met"] = goals_met(out["outcomes"], self.goals)
        return out

    def summary(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        if not all("outcomes" in r for r in runs):
            return {}
        return {"mean_outcomes": mean_of([r["outcomes"] for r in runs])}


#: Periods per year of each trading id, to annualise the Sharpe ratio (trading days; weekday hours).
PERIODS_PER_YEAR = {"TradingStocks-v0": 252, "TradingForex-v0": 24 * 260}
#: The moving-average crossover baseline: long while the fast simple moving average is above the slow one.
CROSSOVER = (50, 200)
#: The goal on the held-out period: a positive return after costs with a Sharpe ratio of at least 1.0 ...
GOAL_SHARPE = 1.0
#: ... on at least this share of the seeds (3 of 5).
GOAL_SHARE = 0.6


def performance(wealth: np.ndarray, positions: np.ndarray, periods_per_year: int = 252) -> dict[str, float]:
    """Total return, Sharpe, drawdown, exposure and turnover of a wealth path ``[T + 1]`` (starts at 1)."""
    step = wealth[1:] / wealth[:-1] - 1.0
    std = step.std()
    peak = np.maximum.accumulate(wealth)
    return {
        "total_return": float(wealth[-1] - 1.0),
        "sharpe": float(step.mean() / std * math.sqrt(periods_per_year)) if std > 0 else 0.0,
        "max_drawdown": float((1.0 - wealth / peak).max()),
        "mean_abs_position": float(np.abs(positions).mean()),
        "mean_position": float(np.mean(positions)),
        "turnover_per_day": float(np.abs(np.diff(positions, prepend=0.0)).mean()),
        "days": len(step),
    }


def play(env_id: str, env_kwargs: dict[str, Any], policy) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """One deterministic episode: wealth path, positions and (for a module) the active options."""
    import gymnasium as gym

    import rl_lightning.envs  # noqa: F401  (registers the trading ids)

    env = gym.make(env_id, **env_kwargs)
    obs, info = env.reset(seed=0)
    wealth, positions, options, t, done = [1.0], [], [], 0, False
    while not done:
        action, option = policy(obs, t)
        obs, _, terminated, truncated, info = env.step(action)
        wealth.append(info["wealth"])
        positions.append(info["position"])
        if option is not None:
            options.append(option)
        t, done = t + 1, terminated or truncated
    return np.array(wealth), np.array(positions), options


def crossover_positions(prices: np.ndarray, fast: int, slow: int) -> np.ndarray:
    """Per close, 1 (long) where the ``fast``-close simple moving average is above the ``slow`` one, else 0
    (flat); 0 before ``slow`` closes exist (a comparison with NaN is false). Only closes up to each one enter
    it (no look-ahead)."""
    csum = np.concatenate([[0.0], np.cumsum(prices)])

    def sma(n: int) -> np.ndarray:
        out = np.full(len(prices), np.nan)
        out[n - 1 :] = (csum[n:] - csum[:-n]) / n
        return out

    return (sma(fast) > sma(slow)).astype(float)


def episode_kwargs(env_kwargs: dict[str, Any], split: str) -> dict[str, Any]:
    """The kwargs of a held-out episode: its split, and the wealth's log as the reward (no shaping)."""
    return {**env_kwargs, "split": split, "turnover_penalty": 0.0}


class Trading(Hook):
    """The policies of the last and the best checkpoint on the held-out period, and the baselines there:
    buy-and-hold, flat and a 50/200 moving-average crossover, on the same env, costs and constraints."""

    @staticmethod
    def evaluate_checkpoint(path: Path, split: str) -> dict[str, Any]:
        import torch
        from omegaconf import OmegaConf
        from tensordict import TensorDict

        from rl_lightning.cli.run import restore_module
        from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

        ckpt = load_checkpoint(str(path))
        saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
        module = restore_module(ckpt, saved)

        def act(obs: np.ndarray, t: int) -> tuple[np.ndarray, int]:
            td = TensorDict({"observation": torch.as_tensor(obs).unsqueeze(0),
                             "step_count": torch.tensor([[t]])}, [1])  # fmt: skip
            out = module.act_eval(td)
            return out["action"][0].numpy(), int(out["option"][0])

        kwargs = episode_kwargs(OmegaConf.to_container(saved.env.kwargs), split)
        wealth, positions, options = play(saved.env.id, kwargs, act)
        shares = np.bincount(np.array(options), minlength=module.num_options) / len(options)
        return {
            **performance(wealth, positions, PERIODS_PER_YEAR[saved.env.id]),
            "option_share": [round(float(c), 4) for c in shares],
            "option_switches": int((np.diff(options) != 0).sum()),
        }

    @staticmethod
    def constant(env_id: str, env_kwargs: dict[str, Any], split: str, position: float) -> dict[str, float]:
        """A constant target ``position`` on ``split`` (a policy's mean exposure held every day), in the env
        of :meth:`baselines`: what the policy's average risk earns without its timing."""
        kwargs = {**episode_kwargs(env_kwargs, split), "no_trade_band": 0.0}
        wealth, positions, _ = play(env_id, kwargs, lambda obs, t: (np.array([position], np.float32), None))
        return performance(wealth, positions, PERIODS_PER_YEAR[env_id])

    @staticmethod
    def baselines(env_id: str, env_kwargs: dict[str, Any], split: str) -> dict[str, dict[str, float]]:
        """Buy-and-hold, flat and the crossover on ``split`` (the crossover's first position is the signal at
        the close before the period: an episode starts there). They pay the run's costs and keep its bounded
        daily change, but not its no-trade band: their targets are the positions they mean to hold (buy-and-
        hold in a band of 0.25 would stop at 0.75)."""
        import gymnasium as gym

        import rl_lightning.envs  # noqa: F401  (registers the trading ids)

        kwargs = {**episode_kwargs(env_kwargs, split), "no_trade_band": 0.0}
        env = gym.make(env_id, **kwargs).unwrapped
        signal, first = crossover_positions(env.prices, *CROSSOVER), env.period(split)[0] - 1
        policies = {
            "buy_and_hold": lambda obs, t: (np.array([1.0], np.float32), None),
            "flat": lambda obs, t: (np.array([0.0], np.float32), None),
            f"crossover_{CROSSOVER[0]}_{CROSSOVER[1]}": lambda obs, t: (
                np.array([signal[first + t]], np.float32), None),
        }  # fmt: skip
        out = {}
        for name, policy in policies.items():
            wealth, positions, _ = play(env_id, kwargs, policy)
            out[name] = performance(wealth, positions, PERIODS_PER_YEAR[env_id])
        return out

    def per_seed(self, run: RunRecord) -> dict[str, Any]:
        from omegaconf import OmegaConf

        from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

        last, best = run.checkpoint("last"), run.checkpoint("best")
        saved = OmegaConf.create(load_checkpoint(str(last))[CONFIG_KEY]["config"])
        env_id, kwargs = saved.env.id, OmegaConf.to_container(saved.env.kwargs)
        out = {
            "env": {"id": env_id, "kwargs": kwargs},
            "best_ckpt_frames (chosen on validation)": run.summary.get("best_frames"),
            "test_last_ckpt": self.evaluate_checkpoint(last, "test"),
            "test_best_ckpt": self.evaluate_checkpoint(best, "test"),
            "validation_last_ckpt": self.evaluate_checkpoint(last, "validation"),
            "validation_best_ckpt": self.evaluate_checkpoint(best, "validation"),
        }
        for which in ("last", "best"):  # the same mean exposure, held constant, on the same test period
            exposure = out[f"test_{which}_ckpt"]["mean_position"]
            out[f"test_constant_exposure_{which}_ckpt"] = self.constant(env_id, kwargs, "test", exposure)
        return out

    def summary(self, runs: list[dict[str, Any]]) -> dict[str, Any]:
        from rl_lightning.training.stats import interval_estimates

        env_id, kwargs = runs[0]["env"]["id"], runs[0]["env"]["kwargs"]
        reference = {split: self.baselines(env_id, kwargs, split) for split in ("test", "validation")}
        hold = reference["test"]["buy_and_hold"]["total_return"]
        figures = ("total_return", "sharpe", "max_drawdown", "turnover_per_day")
        on_test = {
            which: {k: interval_estimates(np.array([[r[f"test_{which}_ckpt"][k]] for r in runs]))
                    for k in figures}
            for which in ("last", "best")
        }  # fmt: skip

        def meets(r: dict[str, Any]) -> bool:
            return r["total_return"] > 0 and r["sharpe"] >= GOAL_SHARPE

        goal = {w: [r["seed"] for r in runs if meets(r[f"test_{w}_ckpt"])] for w in ("last", "best")}
        hold_sharpe = reference["test"]["buy_and_hold"]["sharpe"]

        def above(which: str, figure: str, than: Any) -> list[int]:
            return [r["seed"] for r in runs if r[f"test_{which}_ckpt"][figure] > than(r)[figure]]

        constant = {
            which: {
                "sharpe_above_constant_exposure": above(
                    which, "sharpe", lambda r, w=which: r[f"test_constant_exposure_{w}_ckpt"]),
                "return_above_constant_exposure": above(
                    which, "total_return", lambda r, w=which: r[f"test_constant_exposure_{w}_ckpt"]),
            }
            for which in ("last", "best")
            if all(f"test_constant_exposure_{which}_ckpt" in r for r in runs)
        }  # fmt: skip
        return {
            "data": f"{env_id} ({kwargs.get('dataset', 'its default series')}), held-out test period; "
            f"{kwargs['transaction_cost'] * 1e4:g} bp cost per unit of position changed",
            "baselines": reference,
            "on_test": on_test,
            "beats_buy_and_hold_on_test": {
                which: [r["seed"] for r in runs if r[f"test_{which}_ckpt"]["total_return"] > hold]
                for which in ("last", "best")
            },
            "sharpe_above_buy_and_hold_on_test": {
                which: [r["seed"] for r in runs if r[f"test_{which}_ckpt"]["sharpe"] > hold_sharpe]
                for which in ("last", "best")
            },
            "against_constant_exposure_on_test": constant,
            "goal": f"total return > 0 and Sharpe >= {GOAL_SHARPE} on the test period, "
            f"on at least {GOAL_SHARE:.0%} of the seeds (best.ckpt, chosen on validation)",
            "seeds_meeting_goal": goal,
            "goal_met": len(goal["best"]) >= GOAL_SHARE * len(runs),
        }  # fmt: skip


HOOKS: dict[str, Hook] = {
    "options": Options(),
    "hockey": HockeyOutcomes(),
    "hockey_goals": HockeyOutcomes(goals=GOALS),
    "tdmpc2_hockey_goals": HockeyOutcomes(goals=TDMPC2_GOALS),
    "trading": Trading(),
}
