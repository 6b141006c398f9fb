"""``benchmarks/learning.py``: the statistics a seed gets and what an entry's summary says of its seeds."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def imported(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under its own name: a dataclass reads its string annotations
    through its module in ``sys.modules``, where a module loaded from a spec alone is missing."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def learning() -> ModuleType:
    return imported("learning")


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return imported("_learning_hooks")


def test_threshold_statistics_look_within_the_frames_and_count_late_evaluations(learning) -> None:
    entry = learning.Entry("e", "x", threshold=475.0, within=4000, late_from=3000)
    curve = [[1000, 100.0], [2000, 480.0], [3000, 200.0], [4000, 500.0], [5000, 490.0]]
    stats = learning.threshold_statistics(entry, curve, final=470.0)
    assert stats == {
        "first_reached_at_frames": 2000,
        "best_eval": 500.0,
        "last_eval": 500.0,  # the last evaluation within 4000 frames, not the run's last
        "late_evals_reaching": [2, 3],
        "final_reaches_threshold": False,
    }
    never = learning.threshold_statistics(entry, [[1000, 10.0], [5000, 500.0]], final=None)
    assert never["first_reached_at_frames"] is None and "final_reaches_threshold" not in never


def test_training_statistics_take_the_last_intervals_covering_100_episodes(learning) -> None:
    intervals = [(1000, 60, 1.0), (2000, 60, 2.0), (3000, 50, 4.0)]
    stats = learning.training_statistics(intervals)
    assert stats["train_episodes"] == 170
    assert stats["train_mean"] == pytest.approx((60 + 120 + 200) / 170)
    assert stats["train_last100"] == pytest.approx((120 + 200) / 110)  # 50 + 60 episodes from the end
    assert learning.training_statistics([]) == {}


def run(seed: int, first: int | None, final: float, **extra) -> dict:
    return {"seed": seed, "first_reached_at_frames": first, "best_eval": 500.0, "last_eval": final,
            "final_eval": final, "final_reaches_threshold": final >= 475.0, **extra}  # fmt: skip


def test_a_summary_checks_the_entrys_target_and_sets_published_figures_beside_its_own(learning) -> None:
    published = (learning.Published("last_eval", 400.0, "a paper"),)
    seeds = {str(s): run(s, 1000 * (s + 1), f) for s, f in enumerate((500.0, 480.0, 100.0))}
    reached = learning.Entry("e", "x", published=published, threshold=475.0, needed=3)
    summary = learning.summarise(reached, seeds)
    assert summary["seeds"] == 3 and "train_mean" not in summary  # no seed has it
    assert summary["threshold"]["seeds_reaching"] == 3 and summary["threshold"]["target_met"]
    assert summary["threshold"]["finals_reaching"] == 2
    assert summary["final_eval"]["mean"]["value"] == pytest.approx(360.0)
    assert summary["published"] == [
        {"statistic": "last_eval", "value": 400.0, "source": "a paper", "ours_mean": pytest.approx(360.0),
         "reached": False}
    ]  # fmt: skip
    on_finals = learning.Entry("e", "x", threshold=475.0, needed=3, target="final")
    assert not learning.summarise(on_finals, seeds)["threshold"]["target_met"]


def test_the_learning_table_shows_test_figures_first_and_intervals_from_five_seeds(learning) -> None:
    points = ((10240, 500.0, 480.0), (None, 300.0, 300.0), (30720, 480.0, 100.0), (20480, 500.0, 500.0))
    seeds = {str(s): run(s, f, v, final_eval_checkpoint="best", final_eval_episodes=100, final_eval_last=last)
             for s, (f, v, last) in enumerate(points)}  # fmt: skip
    entry = learning.Entry("e", "x", threshold=475.0, within=50_000, checkpoint="best", target="final")
    summary = learning.summarise(entry, seeds)
    assert summary["splits"]["final_eval"] == "test" and summary["splits"]["last_eval"] == "validation"
    other = {"experiment": "y", "seeds": {}, "summary": {"seeds": 0}}  # no threshold: no row
    results = {"entries": {"e": {"experiment": "x", "seeds": seeds, "summary": summary}, "other": other}}
    header, rule, row = learning.markdown_table(results).splitlines()
    assert header.startswith("| entry | goal | test: seeds reaching it | test: final evaluation")
    # Four seeds: no interval, the seeds' values; test: 3 best checkpoints and 2 last ones reach 475;
    # validation: 3 seeds reached it, the median of 10240, 20480, 30720 frames.
    assert row == (
        "| `e` | 475 within 50k frames | 3 of 4 (last checkpoint: 2) | per seed: 500, 300, 480, 500 (best "
        "checkpoint, 100 episodes); last checkpoint: per seed: 480, 300, 100, 500 | 3 of 4 | 20.5k |"
    )
    assert header.count("|") == rule.count("|") == row.count("|")
    seeds["4"] = run(4, 5000, 490.0, final_eval_checkpoint="best", final_eval_episodes=100,
                     final_eval_last=490.0)  # fmt: skip
    results["entries"]["e"]["summary"] = learning.summarise(entry, seeds)
    row = learning.markdown_table(results).splitlines()[2]
    # Five seeds: the interquartile mean (of 480, 490, 500) with its interval.
    assert "| 4 of 5 (last checkpoint: 3) | 490 [" in row


def test_every_suite_entry_is_well_formed(learning) -> None:
    names = [e.name for entries in learning.SUITES.values() for e in entries]
    assert len(names) == len(set(names))  # a name is the entry's work directory and its key in the results
    for entry in (e for entries in learning.SUITES.values() for e in entries):
        assert entry.checkpoint in ("last", "best") and entry.target in ("reached", "final", "last")
        assert set(entry.hooks) <= set(learning.HOOKS)
        assert entry.threshold is not None or (entry.within, entry.needed, entry.late_from) == (None,) * 3
        for p in entry.published:
            assert p.statistic in ("train_last100", "train_mean", "final_eval", "best_eval", "last_eval")


def test_a_results_file_names_the_command_that_reruns_every_entry_it_holds(learning) -> None:
    from argparse import Namespace

    every = {e.name: {} for e in learning.SUITES["minatar"]}
    args = Namespace(suite="minatar", out=None)
    assert learning.reproduce(args, every) == "python benchmarks/learning.py minatar"
    some = {"rainbow_minimal_space_invaders": {}, "dqn_minimal_breakout": {}}  # named in the suite's order
    assert learning.reproduce(Namespace(suite="minatar", out="mine"), some) == (
        "python benchmarks/learning.py minatar --only dqn_minimal_breakout rainbow_minimal_space_invaders "
        "--out mine"
    )


def test_hockey_outcomes_per_opponent_and_their_mean_over_seeds(hooks) -> None:
    both = {"return_mean": 0.0, "weak/win_rate": 0.9, "weak/loss_rate": 0.04, "weak/draw_rate": 0.06,
            "weak/return_mean": 5.0, "strong/win_rate": 0.7, "strong/loss_rate": 0.2,
            "strong/draw_rate": 0.1, "strong/return_mean": 2.0}  # fmt: skip
    rates = hooks.outcomes(both)
    assert rates["weak"] == {"win_rate": 0.9, "loss_rate": 0.04, "draw_rate": 0.06, "return_mean": 5.0}
    expected = {"weak_win": True, "weak_loss_max": True, "strong_win": False}
    assert hooks.goals_met(rates, hooks.GOALS) == expected
    assert hooks.goals_met(rates, hooks.TDMPC2_GOALS) == {"weak_win": True, "strong_win": True}
    with pytest.raises(ValueError, match="unknown hockey goal"):
        hooks.goals_met(rates, {"weak_draws": 0.1})
    one = {"win_rate": 0.5, "loss_rate": 0.25, "draw_rate": 0.25, "return_mean": 1.0, "return_std": 3.0}
    assert hooks.outcomes(one) == {"win_rate": 0.5, "loss_rate": 0.25, "draw_rate": 0.25, "return_mean": 1.0}
    mean = hooks.mean_of([rates, hooks.outcomes({**both, "weak/win_rate": 0.7})])
    assert mean["weak"]["win_rate"] == pytest.approx(0.8)


def test_trading_performance_of_a_wealth_path(hooks) -> None:
    wealth = np.array([1.0, 1.1, 0.99, 1.2])
    perf = hooks.performance(wealth, np.array([1.0, 1.0, 0.0]))
    assert perf["total_return"] == pytest.approx(0.2)
    assert perf["max_drawdown"] == pytest.approx(0.1)  # 1.1 -> 0.99
    assert perf["mean_abs_position"] == pytest.approx(2 / 3)
    assert perf["turnover_per_day"] == pytest.approx(2 / 3)  # in, hold, out
    assert perf["days"] == 3
    hourly = hooks.performance(wealth, np.array([1.0, 1.0, 0.0]), periods_per_year=252 * 4)
    assert hourly["sharpe"] == pytest.approx(2 * perf["sharpe"])  # annualised by sqrt(periods per year)


def test_the_crossover_is_long_while_the_fast_average_is_above_the_slow_one_from_past_closes(hooks) -> None:
    prices = np.array([5.0, 4.0, 3.0, 4.0, 6.0, 2.0, 1.0])
    # 2-close averages 4.5 3.5 3.5 5 4 1.5 against 3-close ones 4 3.67 4.33 4 3 (from close 2): long at
    # close 4 only (5 > 4.33; at close 5, 4 > 4 fails).
    assert hooks.crossover_positions(prices, 2, 3).tolist() == [0, 0, 0, 0, 1, 0, 0]
    changed = prices.copy()
    changed[5:] = 100.0  # later closes do not move earlier signals
    assert hooks.crossover_positions(changed, 2, 3)[:5].tolist() == [0, 0, 0, 0, 1]


def test_trading_baselines_play_the_held_out_period_with_the_runs_costs(hooks) -> None:
    pytest.importorskip("gym_anytrading")
    kwargs = {"transaction_cost": 0.001, "turnover_penalty": 0.5}  # a shaping term never reaches the wealth
    out = hooks.Trading.baselines("TradingStocks-v0", kwargs, "test")
    assert out["flat"]["total_return"] == 0.0
    assert out["buy_and_hold"]["total_return"] == pytest.approx(0.5943, abs=1e-4)  # GOOGL 2017-01..2018-08
    cross = out["crossover_50_200"]
    assert 0 < cross["mean_abs_position"] <= 1 and cross["turnover_per_day"] < 0.05
    bounded = hooks.Trading.baselines("TradingStocks-v0", {**kwargs, "max_position_change": 0.1}, "test")
    assert bounded["buy_and_hold"]["mean_abs_position"] < 1.0  # it enters in ten steps of 0.1
    banded = hooks.Trading.baselines("TradingStocks-v0", {**kwargs, "no_trade_band": 0.25}, "test")
    assert banded["buy_and_hold"] == out["buy_and_hold"]  # a baseline's target is its position
    # A policy's mean exposure held constant: 1 is buy-and-hold, 0 is flat, 0.2 earns about a fifth.
    constant = hooks.Trading.constant
    assert constant("TradingStocks-v0", kwargs, "test", 1.0) == out["buy_and_hold"]
    assert constant("TradingStocks-v0", kwargs, "test", 0.0) == out["flat"]
    fifth = constant("TradingStocks-v0", kwargs, "test", 0.2)
    assert fifth["mean_position"] == pytest.approx(0.2) and 0.08 < fifth["total_return"] < 0.12


def test_a_seed_joins_what_the_results_file_holds_when_it_finishes(learning, tmp_path, monkeypatch) -> None:
    # Two runs of one suite at once (two processes, other entries or seeds) each add their seed to the file
    # as it is when their seed finishes, not as it was when they started.
    monkeypatch.setattr(learning, "RESULTS", tmp_path)
    path = tmp_path / "minatar.json"

    def run_seed(entry, seed, args):
        if seed == 0:  # meanwhile, another process records its seed in the (still empty) file
            other = {"rainbow_minimal_breakout": {"seeds": {"7": {"seed": 7, "train_mean": 1.0}}}}
            path.write_text(json.dumps({"entries": other}))
        return {"seed": seed, "train_mean": 2.0 + seed}

    monkeypatch.setattr(learning, "run_seed", run_seed)
    argv = [
        "learning.py",
        "minatar",
        "--only",
        "dqn_minimal_breakout",
        "--seeds",
        "0",
        "1",
        "--parallel",
        "1",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    learning.main()
    entries = json.loads(path.read_text())["entries"]
    assert set(entries["rainbow_minimal_breakout"]["seeds"]) == {"7"}
    assert set(entries["dqn_minimal_breakout"]["seeds"]) == {"0", "1"}
    assert entries["dqn_minimal_breakout"]["summary"]["train_mean"]["mean"]["value"] == pytest.approx(2.5)
