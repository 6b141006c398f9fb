"""``report`` and its statistics, against cases computed by hand, scipy's own definitions and rliable's
figures on shared score matrices (``tests/fixtures/rliable_reference.json``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import trim_mean

from rl_lightning.cli import main
from rl_lightning.training.stats import (
    MIN_RUNS_FOR_INTERVAL,
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


def test_the_bootstrap_draws_each_tasks_runs_apart() -> None:
    # Each run scores x on task 0 and -x on task 1, so every run's two tasks sum to 0. Resampling within each
    # task draws the two columns apart and the mean over tasks varies; resampling whole runs (one index for
    # all tasks, a bootstrap without strata) would keep each run's pair together: a mean of exactly 0 always.
    x = np.arange(10.0)
    scores = np.stack([x, -x], axis=1)
    samples = stratified_bootstrap(scores, reps=2000, seed=0)
    assert samples.sum(axis=(1, 2)).std() > 5.0  # apart: sd of the sum of two resampled sums about 12.8
    est = interval_estimates(scores, seed=0)["mean"]
    assert est["value"] == 0.0 and est["high"] - est["low"] > 2.0  # about 2.5 = 2 * 1.96 * 0.64


def test_the_intervals_agree_with_rliables_on_the_same_scores() -> None:
    """rliable's figures (``tests/fixtures/rliable_reference.py`` wrote them, 50,000 replicates) against
    ours: point estimates equal, interval ends within 4 Monte Carlo standard deviations of our own."""
    reference = json.loads((Path(__file__).parents[1] / "fixtures" / "rliable_reference.json").read_text())
    reps = reference["reps"]
    for name, entry in reference["matrices"].items():
        scores = np.array(entry["scores"])
        ours = [interval_estimates(scores, reps=reps, seed=s) for s in range(6)]
        for agg, theirs in entry["estimates"].items():
            assert ours[0][agg]["value"] == pytest.approx(theirs["value"], rel=1e-12), (name, agg)
            for end in ("low", "high"):
                draws = np.array([o[agg][end] for o in ours])
                tolerance = 4 * draws.std(ddof=1) + 1e-9 * abs(theirs[end])
                assert abs(draws.mean() - theirs[end]) <= tolerance, (name, agg, end, draws, theirs[end])


def test_an_interval_needs_five_runs() -> None:
    three = interval_estimates(np.array([[1.0], [2.0], [9.0]]))
    assert three["mean"] == {"value": 4.0, "low": None, "high": None}  # not [min, max] called an interval
    assert MIN_RUNS_FOR_INTERVAL == 5
    five = interval_estimates(np.array([[1.0], [2.0], [9.0], [3.0], [4.0]]))
    assert five["mean"]["low"] < 3.8 < five["mean"]["high"]


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
    assert a["split"] == "validation"  # the in-training evaluations chose the checkpoints
    assert a["last"] == [100, 200, 300, 400, 500] and a["best"] == a["last"]
    assert a["last_estimates"]["iqm"]["value"] == 300.0  # the mean of 200, 300, 400
    assert a["last_estimates"]["median"]["value"] == 300.0
    # By hand: each of b's four 500s beats four of a's and ties one (4.5), its 400 beats three and ties one.
    assert b["improvement_over_a"]["value"] == pytest.approx((4 * 4.5 + 3.5) / 25)
    printed = capsys.readouterr().out
    assert "a · eval_curve · validation (in-training evaluations) · 5 seeds" in printed
    assert "P(b > a) on eval_curve last (validation)" in printed and "iqm 300.00 [" in printed


def test_report_labels_the_held_out_finals_as_test_and_gives_no_interval_under_five(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    finals = [10.0, 20.0, 60.0]
    seeds = {str(i): {"final_eval": v, "eval_curve": [[1000, v + 5]]} for i, v in enumerate(finals)}
    (tmp_path / "l.json").write_text(json.dumps({"entries": {"dqn": {"seeds": seeds}}}))
    assert main(["report", "report.inputs=[l.json]", "report.metric=eval", "report.out=r.json"]) == 0
    out = json.loads((tmp_path / "r.json").read_text())["l"]
    assert out["dqn/final_eval"]["split"] == "test" and out["dqn/final_eval"]["final"] == [10.0, 20.0, 60.0]
    assert out["dqn/final_eval"]["final_estimates"]["mean"] == {"value": 30.0, "low": None, "high": None}
    assert out["dqn/eval_curve"]["split"] == "validation"
    assert out["dqn/eval_curve"]["last"] == [15.0, 25.0, 65.0]
    printed = capsys.readouterr().out
    assert "l · dqn/final_eval · test (held-out episodes) · 3 seeds (per seed)" in printed
    assert "final 10.00, 20.00, 60.00" in printed and "no interval: 3 seeds" in printed


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
    wilsons = json.loads((tmp_path / "r.json").read_text())["w"]["win_rate"]["last_wilson"]
    assert wilsons[0]["low"] == pytest.approx(0.4902, abs=1e-4) and len(wilsons) == 2
