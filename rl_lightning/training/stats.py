"""Aggregate figures over a few seeds, with intervals: what a learning claim should carry.

The methods of Agarwal et al. (2021, "Deep RL at the Edge of the Statistical Precipice", the ``rliable``
package): the interquartile mean (the mean of the middle half of the runs, robust to one outlier seed where
the mean is not and less wasteful than the median), point estimates with 95% percentile intervals from a
stratified bootstrap (runs resampled with replacement within each task), and the probability of
improvement of one configuration over another (the Mann-Whitney statistic, averaged over tasks). Win rates
over games get Wilson score intervals, which stay inside [0, 1] and are not too narrow for few games.

Scores are arrays ``[runs, tasks]`` (one column for one task). Plain numpy, deterministic for a seed.

An interval needs runs: with 3 runs the IQM is the plain mean, and a percentile bootstrap returns exactly
the range of the runs, which is not a 95% interval of anything. Below :data:`MIN_RUNS_FOR_INTERVAL` runs
:func:`interval_estimates` gives the point estimates alone and a report shows the per-run values. The
intervals agree with ``rliable``'s on the same score matrices (``tests/cli/test_report.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "AGGREGATES", "MIN_RUNS_FOR_INTERVAL", "interval_estimates", "iqm", "probability_of_improvement",
    "stratified_bootstrap", "wilson",
]  # fmt: skip


def _iqm(sets: np.ndarray) -> np.ndarray:
    """The interquartile mean of each row of ``sets`` ``[n, scores]``."""
    x = np.sort(sets, axis=1)
    cut = int(0.25 * x.shape[1])
    return x[:, cut : x.shape[1] - cut].mean(axis=1)


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of all runs and tasks: the mean of the scores left when the lowest and the
    highest ``floor(n / 4)`` are dropped (``scipy.stats.trim_mean(x, 0.25)``, as rliable computes it)."""
    return float(_iqm(np.asarray(scores, dtype=float).reshape(1, -1))[0])


#: The aggregates a report gives. Each maps ``n`` sets of scores, ``[n, runs * tasks]`` (a set's runs and
#: tasks flattened), to ``[n]`` figures: the bootstrap's replicates in one array operation, not one call each
#: (2000 Python calls per aggregate made the docs' intervals take most of a docs build).
AGGREGATES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "iqm": _iqm,
    "mean": lambda sets: sets.mean(axis=1),
    # The median of all runs' scores; rliable's ``aggregate_median`` is the median over tasks of each task's
    # mean score (on one task, the mean).
    "median": lambda sets: np.median(sets, axis=1),
}


#: The fewest runs (per task) an interval is given for; with fewer, the runs' own values say more.
MIN_RUNS_FOR_INTERVAL = 5


def _runs_by_tasks(scores: np.ndarray) -> np.ndarray:
    return np.asarray(scores, dtype=float).reshape(len(scores), -1)


def stratified_bootstrap(scores: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """``[reps, runs, tasks]``: each replicate resamples the runs with replacement within each task."""
    scores = _runs_by_tasks(scores)
    runs, tasks = scores.shape
    rng = np.random.default_rng(seed)
    index = rng.integers(0, runs, size=(reps, runs, tasks))
    return np.take_along_axis(scores[None].repeat(reps, 0), index, axis=1)


def interval_estimates(
    scores: np.ndarray, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, dict[str, float]]:
    """``{aggregate: {"value", "low", "high"}}``: each of :data:`AGGREGATES` on ``scores`` and its
    percentile interval over a stratified bootstrap; ``low`` and ``high`` are ``None`` with fewer than
    :data:`MIN_RUNS_FOR_INTERVAL` runs."""
    scores = _runs_by_tasks(scores)
    enough = len(scores) >= MIN_RUNS_FOR_INTERVAL
    samples = stratified_bootstrap(scores, reps, seed).reshape(reps, -1) if enough else None
    tail = (1 - confidence) / 2 * 100
    out = {}
    for name, aggregate in AGGREGATES.items():
        value = float(aggregate(scores.reshape(1, -1))[0])
        low = high = None
        if samples is not None:
            low, high = (float(v) for v in np.percentile(aggregate(samples), [tail, 100 - tail]))
        out[name] = {"value": value, "low": low, "high": high}
    return out


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(X > Y) per task (ties count a half), averaged over tasks, for each of ``n`` pairs of score sets
    ``x`` ``[n, runs_x, tasks]`` and ``y`` ``[n, runs_y, tasks]``: ``[n]``. One task at a time, so that
    memory stays ``n * runs_x * runs_y``."""
    per_task = [
        ((a[:, :, None] > b[:, None, :]) + 0.5 * (a[:, :, None] == b[:, None, :])).mean(axis=(1, 2))
        for a, b in zip(np.moveaxis(x, 2, 0), np.moveaxis(y, 2, 0), strict=True)
    ]
    return np.mean(per_task, axis=0)


def probability_of_improvement(
    x: np.ndarray, y: np.ndarray, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """The probability that a run of configuration ``x`` scores above one of ``y`` (``[runs, tasks]`` each,
    the same tasks), with its stratified-bootstrap percentile interval (each side resampled apart)."""
    x, y = _runs_by_tasks(x), _runs_by_tasks(y)
    values = _improvement(stratified_bootstrap(x, reps, seed), stratified_bootstrap(y, reps, seed + 1))
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return {"value": float(_improvement(x[None], y[None])[0]), "low": float(low), "high": float(high)}


def wilson(wins: float, games: int, z: float = 1.959964) -> dict[str, float]:
    """The Wilson score interval of a win rate (95% by default): ``{"value", "low", "high"}``."""
    if games <= 0:
        raise ValueError("a win rate needs at least one game.")
    p = wins / games
    centre = (p + z * z / (2 * games)) / (1 + z * z / games)
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / (1 + z * z / games)
    return {"value": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half)}
