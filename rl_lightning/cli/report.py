"""``python -m rl_lightning report report.inputs=[...]``: learning figures over seeds, with 95% intervals.

Each input is one configuration, its runs the seeds (a benchmark result or ``mlflow:<run name>``, read as
``plot`` reads them). Every figure says which episodes it comes from (docs/evaluation.md):

- **validation**: for every curve whose name contains ``report.metric`` (the in-training evaluations, which
  replay the run's ``eval.seed`` episodes and chose ``best.ckpt``), per seed its last value and its best;
- **test**: in a benchmark result, each entry's ``final_eval`` per seed (held-out episodes that neither
  training nor selection saw): the figure to report.

Over the seeds: the interquartile mean, mean and median, each with a 95% interval from a stratified
bootstrap (:mod:`rl_lightning.training.stats`) when there are at least 5 seeds; with fewer, the seeds'
values alone. With several inputs, the probability that a run of each configuration ends above a run of
the first. With ``report.games`` (games per evaluation), every seed's last win rate gets a Wilson interval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rl_lightning.cli.plot import Curve, load_groups
from rl_lightning.training.stats import (
    MIN_RUNS_FOR_INTERVAL,
    interval_estimates,
    probability_of_improvement,
    wilson,
)

__all__ = ["report", "seed_figures", "test_finals"]


def seed_figures(curves: list[Curve]) -> dict[str, list[float]]:
    """``{"last": [...], "best": [...]}``, one value per seed's curve, in the curves' order."""
    last = [float(y[np.argmax(x)]) for _, x, y in curves]
    best = [float(np.nanmax(y)) for _, _, y in curves]
    return {"last": last, "best": best}


def test_finals(path: str | Path) -> dict[str, list[float]]:
    """``{"<entry>/final_eval": [per-seed values]}`` of a benchmark result: the held-out test figures of
    the learning runner's entries (``entries.<name>.seeds.<seed>.final_eval``) or of a plain list of seeds
    (``seeds[i].final_eval``)."""
    data = json.loads(Path(path).read_text())
    entries = data.get("entries") or {"": data}
    out = {}
    for name, entry in entries.items():
        seeds = entry.get("seeds") or {}
        runs = seeds.values() if isinstance(seeds, dict) else seeds
        values = [float(r["final_eval"]) for r in runs if isinstance(r, dict) and "final_eval" in r]
        if values:
            out[f"{name}/final_eval" if name else "final_eval"] = values
    return out


def _estimates_line(name: str, values: list[float], est: dict[str, dict[str, Any]]) -> str:
    if len(values) < MIN_RUNS_FOR_INTERVAL:
        return (
            f"  {name:<6}"
            + "  ".join(f"{k} {v['value']:.2f}" for k, v in est.items())
            + (f"  (no interval: {len(values)} seeds, an interval needs {MIN_RUNS_FOR_INTERVAL})")
        )
    return f"  {name:<6}" + "  ".join(
        f"{k} {v['value']:.2f} [{v['low']:.2f}, {v['high']:.2f}]" for k, v in est.items()
    )


def _figures(split: str, figures: dict[str, list[float]], reps: int) -> dict[str, Any]:
    entry: dict[str, Any] = {"split": split, "seeds": len(next(iter(figures.values()))), **figures}
    for kind, values in figures.items():
        entry[f"{kind}_estimates"] = interval_estimates(np.array(values)[:, None], reps=reps)
    return entry


def _print(label: str, name: str, split: str, entry: dict[str, Any], kinds: tuple[str, ...]) -> None:
    seeds = entry["seeds"]
    intervals = "95% intervals, stratified bootstrap" if seeds >= MIN_RUNS_FOR_INTERVAL else "per seed"
    print(f"{label} · {name} · {split} · {seeds} seeds ({intervals})")
    for kind in kinds:
        print(f"  {kind:<6}" + ", ".join(f"{v:.2f}" for v in entry[kind]))
        print(_estimates_line(kind, entry[kind], entry[f"{kind}_estimates"]))


def report(cfg: DictConfig) -> dict[str, Any]:
    """Prints the report of ``report.inputs`` and returns it (also written to ``report.out`` when set)."""
    node = cfg.report
    groups = load_groups(cfg, node, "report")
    reps, out = int(node.reps), {}
    inputs = [str(i) for i in node.inputs]
    for (label, curves), item in zip(groups.items(), inputs, strict=True):
        out[label] = {}
        for name, runs in sorted(curves.items()):
            entry = _figures("validation", seed_figures(runs), reps)
            if node.games and name.endswith("win_rate"):
                entry["last_wilson"] = [wilson(round(v * node.games), int(node.games)) for v in entry["last"]]
            out[label][name] = entry
            _print(label, name, "validation (in-training evaluations)", entry, ("last", "best"))
        if not item.startswith("mlflow:"):
            for name, values in test_finals(item).items():
                entry = _figures("test", {"final": values}, reps)
                out[label][name] = entry
                _print(label, name, "test (held-out episodes)", entry, ("final",))
    labels = list(out)
    if len(labels) > 1:
        first = labels[0]
        for label in labels[1:]:
            for name in sorted(set(out[label]) & set(out[first])):
                kind = "final" if out[label][name]["split"] == "test" else "last"
                x, y = (np.array(out[lb][name][kind])[:, None] for lb in (label, first))
                p = probability_of_improvement(x, y, reps=reps)
                out[label][name]["improvement_over_" + first] = p
                few = min(len(x), len(y)) < MIN_RUNS_FOR_INTERVAL
                interval = "" if few else f" [{p['low']:.2f}, {p['high']:.2f}]"
                print(f"P({label} > {first}) on {name} {kind} ({out[label][name]['split']}): "
                      f"{p['value']:.2f}{interval}")  # fmt: skip
    if node.out:
        Path(node.out).parent.mkdir(parents=True, exist_ok=True)
        Path(node.out).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {node.out}")
    return out
