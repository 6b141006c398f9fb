"""``python -m rl_lightning report report.inputs=[...]``: learning figures over seeds, with 95% intervals.

Each input is one configuration, its runs the seeds (a benchmark result or ``mlflow:<run name>``, read as
``plot`` reads them). For every curve whose name contains ``report.metric``, per seed its final value (the
last evaluation) and its best, then over the seeds the interquartile mean, mean and median, each with a
95% interval from a stratified bootstrap (:mod:`rl_lightning.training.stats`). With several inputs, the
probability that a run of each configuration ends above a run of the first. With ``report.games`` (games
per evaluation), every seed's final win rate gets a Wilson interval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rl_lightning.cli.plot import Curve, load_groups
from rl_lightning.training.stats import interval_estimates, probability_of_improvement, wilson

__all__ = ["report", "seed_figures"]


def seed_figures(curves: list[Curve]) -> dict[str, list[float]]:
    """``{"final": [...], "best": [...]}``, one value per seed's curve, in the curves' order."""
    final = [float(y[np.argmax(x)]) for _, x, y in curves]
    best = [float(np.nanmax(y)) for _, _, y in curves]
    return {"final": final, "best": best}


def _line(name: str, est: dict[str, dict[str, float]]) -> str:
    return f"  {name:<6}" + "  ".join(
        f"{k} {v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]" for k, v in est.items()
    )


def report(cfg: DictConfig) -> dict[str, Any]:
    """Prints the report of ``report.inputs`` and returns it (also written to ``report.out`` when set)."""
    node = cfg.report
    groups = load_groups(cfg, node, "report")
    reps, out = int(node.reps), {}
    for label, curves in groups.items():
        out[label] = {}
        for name, runs in sorted(curves.items()):
            figures = seed_figures(runs)
            entry: dict[str, Any] = {"seeds": len(runs), **figures}
            for kind, values in figures.items():
                entry[f"{kind}_estimates"] = interval_estimates(np.array(values)[:, None], reps=reps)
            if node.games and name.endswith("win_rate"):
                entry["final_wilson"] = [
                    wilson(round(v * node.games), int(node.games)) for v in figures["final"]
                ]
            out[label][name] = entry
            print(f"{label} · {name} · {len(runs)} seeds (95% intervals, stratified bootstrap)")
            print("  final " + ", ".join(f"{v:.2f}" for v in figures["final"]))
            print(_line("final", entry["final_estimates"]))
            print(_line("best", entry["best_estimates"]))
    labels = list(out)
    if len(labels) > 1:
        first = labels[0]
        for label in labels[1:]:
            for name in sorted(set(out[label]) & set(out[first])):
                x, y = (np.array(out[lb][name]["final"])[:, None] for lb in (label, first))
                p = probability_of_improvement(x, y, reps=reps)
                out[label][name]["improvement_over_" + first] = p
                interval = f"{p['value']:.2f} [{p['low']:.2f}, {p['high']:.2f}]"
                print(f"P({label} > {first}) on {name} final: {interval}")
    if node.out:
        Path(node.out).parent.mkdir(parents=True, exist_ok=True)
        Path(node.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {node.out}")
    return out
