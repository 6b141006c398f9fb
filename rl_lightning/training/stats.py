"""Aggregate figures over a few seeds, with intervals: what a learning claim should carry.

The methods of Agarwal et al. (2021, "Deep RL at the Edge of the Statistical Precipice", the ``rliable``
package): the interquartile mean (the mean of the middle half of the runs, robust to one outlier seed where
the mean is not and less wasteful than the median), point estimates with 95% percentile intervals from a
stratified bootstrap (runs resampled with replacement within each task), and the probability of
improvement of one configuration over another (the Mann-Whitney statistic, averaged over tasks). Win rates
over games get Wilson score intervals, which stay inside [0, 1] and are not too narrow for few games.

Scores are arrays ``[runs, tasks]`` (one column for one task). Plain numpy, deterministic for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

__all__ = [
    "AGGREGATES", "interval_estimates", "iqm", "probability_of_improvement", "stratified_bootstrap", "wilson",
]  # fmt: skip


def iqm(scores: np.ndarray) -> float:
    """The interquartile mean of all runs and tasks: the mean of the scores left when the lowest and the
    highest ``floor(n / 4)`` are dropped (``scipy.stats.trim_mean(x, 0.25)``, as rliable computes it)."""
    x = np.sort(np.asarray(scores, dtype=float).ravel())
    cut = int(0.25 * x.size)
    return float(x[cut : x.size - cut].mean())


#: The aggregates a report gives, each ``scores [runs, tasks] -> float``.
AGGREGATES: dict[str, Callable[[np.ndarray], float]] = {
    "iqm": iqm,
    "mean": lambda s: float(np.mean(s)),
    "median": lambda s: float(np.median(s)),
}


def stratified_bootstrap(scores: np.ndarray, reps: int, seed: int) -> np.ndarray:
    """``[reps, runs, tasks]``: each replicate resamples the runs with replacement within each task."""
    scores = np.asarray(scores, dtype=float).reshape(len(scores), -1)
    runs, tasks = scores.shape
    rng = np.random.default_rng(seed)
    index = rng.integers(0, runs, size=(reps, runs, tasks))
    return np.take_along_axis(scores[None].repeat(reps, 0), index, axis=1)


def interval_estimates(
    scores: np.ndarray, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, dict[str, float]]:
    """``{aggregate: {"value", "low", "high"}}``: each of :data:`AGGREGATES` on ``scores`` and its
    percentile interval over a stratified bootstrap."""
    samples = stratified_bootstrap(scores, reps, seed)
    tail = (1 - confidence) / 2 * 100
    out = {}
    for name, aggregate in AGGREGATES.items():
        values = np.array([aggregate(s) for s in samples])
        low, high = np.percentile(values, [tail, 100 - tail])
        out[name] = {"value": aggregate(scores), "low": float(low), "high": float(high)}
    return out


def _improvement(x: np.ndarray, y: np.ndarray) -> float:
    """P(X > Y) per task (ties count a half), averaged over tasks."""
    wins = (x[:, None, :] > y[None, :, :]) + 0.5 * (x[:, None, :] == y[None, :, :])
    return float(wins.mean(axis=(0, 1)).mean())


def probability_of_improvement(
    x: np.ndarray, y: np.ndarray, reps: int = 2000, confidence: float = 0.95, seed: int = 0
) -> dict[str, float]:
    """The probability that a run of configuration ``x`` scores above one of ``y`` (``[runs, tasks]`` each,
    the same tasks), with its stratified-bootstrap percentile interval (each side resampled apart)."""
    x = np.asarray(x, dtype=float).reshape(len(x), -1)
    y = np.asarray(y, dtype=float).reshape(len(y), -1)
    xs, ys = stratified_bootstrap(x, reps, seed), stratified_bootstrap(y, reps, seed + 1)
    values = np.array([_improvement(a, b) for a, b in zip(xs, ys)])
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(values, [tail, 100 - tail])
    return {"value": _improvement(x, y), "low": float(low), "high": float(high)}


def wilson(wins: float, games: int, z: float = 1.959964) -> dict[str, float]:
    """The Wilson score interval of a win rate (95% by default): ``{"value", "low", "high"}``."""
    if games <= 0:
        raise ValueError("a win rate needs at least one game.")
    p = wins / games
    centre = (p + z * z / (2 * games)) / (1 + z * z / games)
    half = z * math.sqrt(p * (1 - p) / games + z * z / (4 * games * games)) / (1 + z * z / games)
    return {"value": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half)}
