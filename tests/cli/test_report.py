"""``report`` and its statistics, against cases computed by hand and scipy's own definitions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import trim_mean

from rl_lightning.cli import main
from rl_lightning.training.stats import (
    interval_estimates,
    iqm,
    probability_of_improvement,
    stratified_bootstrap,
    wilson,
)


def test_the_interquartile_mean_drops_a_quarter_at_each_end() -> None:
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5  # the mean of 3, 4, 5, 6
    assert iqm([[1.0, 100.0], [2.0, 3.0]]) == 2.5  # runs x tasks, all scores together: the mean of 2, 3
    assert iqm([1.0, 2.0, 30.0]) == 11.0  # fewer than 4 runs: nothing to drop
    rng = np.random.default_rng(0)
    for n in range(1, 20):  # rliable's definition
        x = rng.normal(size=n)
        assert iqm(x) == pytest.approx(trim_mean(x, 0.25))


def test_the_wilson_interval_of_8_wins_in_10() -> None:
    # Hand computation, z = 1.96: centre (0.8 + 0.19208) / 1.38416 = 0.71674, half-width 0.22659.
    w = wilson(8, 10)
    assert w["value"] == 0.8
    assert w["low"] == pytest.approx(0.4902, abs=1e-4) and w["high"] == pytest.approx(0.9433, abs=1e-4)
    assert wilson(0, 20)["low"] == 0.0 and wilson(20, 20)["high"] == 1.0
    assert wilson(0, 20)["high"] == pytest.approx(0.1611, abs=1e-4)  # no win seen is not a zero rate
    with pytest.raises(ValueError):
        wilson(1, 0)


def test_the_probability_of_improvement_counts_pairs_and_halves_ties() -> None:
    # 1 > 0, 1 < 3, 2 > 0, 2 < 3: two of four pairs.
    assert probability_of_improvement([1, 2], [0, 3])["value"] == 0.5
    assert probability_of_improvement([5, 5], [5, 5])["value"] == 0.5
    p = probability_of_improvement([9, 10, 11], [1, 2, 3])
    assert p == {"value": 1.0, "low": 1.0, "high": 1.0}  # every resample of x beats every one of y
    # Two tasks: the average of the per-task probabilities (1.0 and 0.0).
    assert probability_of_improvement([[2, 0], [3, 1]], [[0, 5], [1, 6]])["value"] == 0.5


def test_the_bootstrap_resamples_runs_within_each_task() -> None:
    scores = np.array([[0.0, 100.0], [1.0, 101.0], [2.0, 102.0]])
    samples = stratified_bootstrap(scores, reps=500, seed=3)
    assert samples.shape == (500, 3, 2)
    assert set(np.unique(samples[..., 0])) <= {0.0, 1.0, 2.0}  # task 0's runs stay in task 0
    assert set(np.unique(samples[..., 1])) <= {100.0, 101.0, 102.0}
    assert np.array_equal(samples, stratified_bootstrap(scores, reps=500, seed=3))  # a seed repeats it


def test_intervals_hold_the_estimate_and_collapse_for_equal_runs() -> None:
    est = interval_estimates(np.array([[500.0]] * 5))
    assert est["iqm"] == {"value": 500.0, "low": 500.0, "high": 500.0}
    rng = np.random.default_rng(1)
    scores = rng.normal(100, 10, size=(10, 1))
    for name, e in interval_estimates(scores, seed=2).items():
        assert e["low"] <= e["value"] <= e["high"], name
    # 95% intervals of the mean cover the true mean most of the time (about 95 of 100 here).
    covered = 0
    for seed in range(100):
        x = np.random.default_rng(100 + seed).normal(0, 1, size=(10, 1))
        e = interval_estimates(x, reps=400, seed=seed)["mean"]
        covered += e["low"] <= 0 <= e["high"]
    assert covered >= 85


def test_intervals_are_the_percentiles_of_each_replicates_figure() -> None:
    # The bootstrap's replicates are aggregated in one array operation: each replicate's figure is the one
    # its scores give alone (scipy's trimmed mean, numpy's mean and median; P(X > Y) pair by pair).
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(5, 3)), rng.normal(0.3, 1, size=(4, 3))
    reps, seed = 300, 1
    alone = {"iqm": lambda s: trim_mean(s.ravel(), 0.25), "mean": np.mean, "median": np.median}
    estimates = interval_estimates(x, reps=reps, seed=seed)
    for name, figure in alone.items():
        low, high = np.percentile([figure(s) for s in stratified_bootstrap(x, reps, seed)], [2.5, 97.5])
        assert estimates[name]["low"] == pytest.approx(low) and estimates[name]["high"] == pytest.approx(high)

    def improvement(a: np.ndarray, b: np.ndarray) -> float:
        per_task = [np.mean([(u > v) + 0.5 * (u == v) for u in a[:, t] for v in b[:, t]]) for t in range(3)]
        return float(np.mean(per_task))

    xs, ys = stratified_bootstrap(x, reps, seed), stratified_bootstrap(y, reps, seed + 1)
    low, high = np.percentile([improvement(a, b) for a, b in zip(xs, ys)], [2.5, 97.5])
    p = probability_of_improvement(x, y, reps=reps, seed=seed)
    assert p["value"] == pytest.approx(improvement(x, y))
    assert p["low"] == pytest.approx(low) and p["high"] == pytest.approx(high)


def test_report_reads_the_seeds_of_each_input_and_compares_them(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for name, finals in (("a", [100, 200, 300, 400, 500]), ("b", [500, 500, 500, 400, 500])):
        seeds = [{"seed": i, "eval_curve": [[1000, 10.0], [2000, float(v)]]} for i, v in enumerate(finals)]
        (tmp_path / f"{name}.json").write_text(json.dumps({"seeds": seeds}))
    assert main(["report", "report.inputs=[a.json,b.json]", "report.metric=eval", "report.out=r.json"]) == 0
    out = json.loads((tmp_path / "r.json").read_text())
    a, b = out["a"]["eval_curve"], out["b"]["eval_curve"]
    assert a["final"] == [100, 200, 300, 400, 500] and a["best"] == a["final"]
    assert a["final_estimates"]["iqm"]["value"] == 300.0  # the mean of 200, 300, 400
    assert a["final_estimates"]["median"]["value"] == 300.0
    # By hand: each of b's four 500s beats four of a's and ties one (4.5), its 400 beats three and ties one.
    assert b["improvement_over_a"]["value"] == pytest.approx((4 * 4.5 + 3.5) / 25)
    printed = capsys.readouterr().out
    assert "P(b > a) on eval_curve final" in printed and "iqm 300.00 [" in printed


def test_report_gives_each_seeds_final_win_rate_its_wilson_interval(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    seeds = [{"seed": i, "win_rate": [[100, 0.5], [200, v]]} for i, v in enumerate([0.8, 0.9])]
    (tmp_path / "w.json").write_text(json.dumps({"seeds": seeds}))
    args = [
        "report",
        "report.inputs=[w.json]",
        "report.metric=win_rate",
        "report.games=10",
        "report.out=r.json",
    ]
    assert main(args) == 0
    wilsons = json.loads((tmp_path / "r.json").read_text())["w"]["win_rate"]["final_wilson"]
    assert wilsons[0]["low"] == pytest.approx(0.4902, abs=1e-4) and len(wilsons) == 2
