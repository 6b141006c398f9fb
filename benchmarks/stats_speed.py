"""The bootstrap intervals of ``report`` and the docs, timed against the code of an earlier revision.

``interval_estimates`` (IQM, mean and median, each with its 95% stratified-bootstrap interval over 2000
replicates) and ``probability_of_improvement`` of ``rl_lightning/training/stats.py`` at ``--before`` (read
with ``git show``) and in this tree, in alternating rounds, on scores of the shapes a learning result has:
3 and 10 seeds of one task, 5 seeds of 5 tasks. Each figure of this tree's is checked against before's
(equal up to float rounding). Reported: milliseconds per call (median of the rounds) and the speed-ups.

    python benchmarks/stats_speed.py --before cc9191c [--rounds 5]

Writes ``benchmarks/results/stats.json``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from _common import module_at, write

from rl_lightning.training import stats

#: runs x tasks
SHAPES = [(3, 1), (10, 1), (5, 5)]


def figures(module, x: np.ndarray, y: np.ndarray) -> dict[str, Callable[[], dict]]:
    return {
        "interval_estimates": lambda: module.interval_estimates(x),
        "probability_of_improvement": lambda: module.probability_of_improvement(x, y),
    }


def flat(result: dict) -> list[float]:
    return [v for value in result.values() for v in (flat(value) if isinstance(value, dict) else [value])]


def timed(call: Callable[[], dict], repeats: int) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the revision to compare with")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    old = module_at(args.before, "rl_lightning/training/stats.py")
    rng = np.random.default_rng(0)
    ms: dict[str, dict[str, float]] = {}
    for runs, tasks in SHAPES:
        x, y = rng.normal(size=(runs, tasks)), rng.normal(0.5, 1, size=(runs, tasks))
        before, after = figures(old, x, y), figures(stats, x, y)
        for name in before:
            case = f"{name} {runs}x{tasks}"
            want, got = flat(before[name]()), flat(after[name]())  # warm-up, and the figures checked
            same = [math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(want, got, strict=True)]
            if not all(same):
                sys.exit(f"{case}: {got} differs from before's {want}")
            times: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.rounds):
                times["before"].append(timed(before[name], 3))
                times["after"].append(timed(after[name], 30))
            ms[case] = {k: round(statistics.median(t) * 1e3, 3) for k, t in times.items()}
            ms[case]["speedup"] = round(ms[case]["before"] / ms[case]["after"], 1)
    payload = {"before": args.before, "reps": 2000, "rounds": args.rounds, "ms_per_call": ms}
    print(payload)
    write("stats", payload)


if __name__ == "__main__":
    main()
