"""``python -m rl_lightning plot plot.inputs=[...]``: learning curves, mean and spread over seeds, vs frames.

Inputs are benchmark results (``benchmarks/results/<name>.json``) or MLflow runs (``mlflow:<run name>``,
every run of that name in the store of ``logger.tracking_uri``, one per seed):

- in a benchmark JSON, a curve is a list of ``[frames, value]`` pairs; curves under ``seeds[i].<name>``
  (a list of seeds) or ``seeds.<seed>.<name>`` (seeds keyed by their number, as the learning runner's
  suites hold them) are the seeds of curve ``<name>``, curves under any other key stand alone;
- in MLflow, a curve is the history of a metric (``eval/return_mean``, ...) against frames.

Curves whose name contains ``plot.metric`` are drawn, one panel per curve name: the mean over seeds (on
the union of their frame counts, each seed held at its last value in between) and the band from the
lowest to the highest seed. Needs matplotlib (``pip install 'rl_lightning[plot]'``).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from rl_lightning.cli.config import CliError

__all__ = ["Curve", "curves_from_json", "curves_from_mlflow", "load_groups", "plot", "plot_curves"]

#: ``(label, frames, values)`` of one seed's curve.
Curve = tuple[str, np.ndarray, np.ndarray]


def _is_curve(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(v, int | float) for v in p)
            for p in value
        )
    )


def _walk(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    if isinstance(node, dict):
        keyed_seeds = bool(path) and path[-1] == "seeds"
        for key, value in node.items():
            yield from _walk(value, (*path, f"[{key}]" if keyed_seeds else str(key)))
    elif _is_curve(node):
        yield path, node
    elif isinstance(node, list):
        for i, value in enumerate(node):
            label = str(value.get("seed", i)) if isinstance(value, dict) else str(i)
            yield from _walk(value, (*path, f"[{label}]"))


def curves_from_json(path: str | Path) -> dict[str, list[Curve]]:
    """``{curve name: [per-seed curves]}`` of a benchmark result (see the module docstring)."""
    data = json.loads(Path(path).read_text())
    out: dict[str, list[Curve]] = defaultdict(list)
    for keys, points in _walk(data):
        seed = next((k[1:-1] for k in keys if k.startswith("[")), None)
        name = "/".join(k for k in keys if not k.startswith("[") and k not in ("entries", "seeds", "curves"))
        array = np.asarray(points, dtype=float)
        out[name].append((f"seed {seed}" if seed is not None else name, array[:, 0], array[:, 1]))
    return dict(out)


def curves_from_mlflow(
    tracking_uri: str, run_name: str, experiment: str = "rl_lightning"
) -> dict[str, list[Curve]]:
    """``{metric: [one curve per run named run_name]}`` from an MLflow store."""
    import mlflow

    from rl_lightning.training.mlflow_logger import live_history

    client = mlflow.MlflowClient(tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise CliError(f"no MLflow experiment '{experiment}' in {tracking_uri}.")
    runs = client.search_runs([exp.experiment_id], filter_string=f"attributes.run_name = '{run_name}'")
    if not runs:
        raise CliError(f"no MLflow run named '{run_name}' in {tracking_uri}.")
    out: dict[str, list[Curve]] = defaultdict(list)
    for run in runs:
        seed = run.data.params.get("seed", run.info.run_id[:6])
        for metric in run.data.metrics:
            records = live_history(client.get_metric_history(run.info.run_id, metric))
            history = [(m.step, m.value) for m in records]
            array = np.asarray(history, dtype=float)
            out[metric].append((f"seed {seed}", array[:, 0], array[:, 1]))
    return dict(out)


def _aligned(curves: list[Curve]) -> tuple[np.ndarray, np.ndarray]:
    """Frames (the union of the seeds') and values ``[seeds, frames]``, each seed held at its last value."""
    frames = np.unique(np.concatenate([c[1] for c in curves]))
    rows = []
    for _, x, y in curves:
        order = np.argsort(x)
        x, y = x[order], y[order]
        idx = np.searchsorted(x, frames, side="right") - 1
        rows.append(np.where(idx >= 0, y[np.clip(idx, 0, None)], np.nan))
    return frames, np.vstack(rows)


def frames_label(value: float, _position: object = None) -> str:
    """An axis tick of environment frames: ``0``, ``500``, ``100k``, ``1.5M``."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.4g}{suffix}"
    return f"{value:.4g}"


def grid(panels: int) -> tuple[int, int]:
    """``(rows, columns)`` for ``panels`` panels: one row up to three, then about square, never a whole
    empty row."""
    cols = panels if panels <= 3 else math.ceil(math.sqrt(panels))
    return math.ceil(panels / cols), cols


def plot_curves(groups: dict[str, dict[str, list[Curve]]], out: str | Path, title: str = "") -> Path:
    """Draws ``{input label: {curve name: curves}}``: one panel per curve name, one line per input.

    Returns:
        The image written (PNG, or what the suffix of ``out`` says).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError:
        raise CliError("plot needs matplotlib: pip install 'rl_lightning[plot]'.") from None
    names = sorted({name for curves in groups.values() for name in curves})
    if not names:
        raise CliError("nothing to plot: no curve matched plot.metric.")
    rows, cols = grid(len(names))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        for label, curves in groups.items():
            if name not in curves:
                continue
            frames, values = _aligned(curves[name])
            mean = np.nanmean(values, axis=0)
            n = len(curves[name])
            (line,) = ax.plot(frames, mean, label=f"{label} (mean of {n})" if n > 1 else label)
            if n > 1:
                ax.fill_between(
                    frames, np.nanmin(values, 0), np.nanmax(values, 0), color=line.get_color(), alpha=0.2
                )
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("environment frames")
        ax.xaxis.set_major_formatter(FuncFormatter(frames_label))
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def default_label(item: str) -> str:
    """An input's label in the legend: the run name of ``mlflow:NAME``, a result file's name, with ``_`` as
    spaces (``sac_hockey`` -> ``sac hockey``)."""
    name = item.split(":", 1)[1] if item.startswith("mlflow:") else Path(item).stem
    return name.replace("_", " ")


def load_groups(cfg: DictConfig, node: DictConfig, command: str) -> dict[str, dict[str, list[Curve]]]:
    """``{label: {curve name: per-seed curves}}`` of ``node.inputs`` (benchmark results, ``mlflow:NAME``),
    the curves whose name contains ``node.metric``, labelled by ``node.labels`` or their names."""
    if not node.inputs:
        raise CliError(
            f"{command} needs {command}.inputs=[benchmarks/results/NAME.json, mlflow:RUN_NAME, ...]."
        )
    labels = list(node.get("labels") or [])
    if labels and len(labels) != len(node.inputs):
        n = f"{len(labels)} labels for {len(node.inputs)} inputs"
        raise CliError(f"{command}.labels has {n}; give one per input, in order.")
    mlflow = cfg.logger and cfg.logger.type == "mlflow"
    uri = str(cfg.logger.tracking_uri) if mlflow else "sqlite:///mlflow.db"
    groups: dict[str, dict[str, list[Curve]]] = {}
    for i, item in enumerate(node.inputs):
        item = str(item)
        if item.startswith("mlflow:"):
            curves = curves_from_mlflow(uri, item.split(":", 1)[1])
        else:
            if not Path(item).is_file():
                raise CliError(f"{command} input not found: {item}")
            curves = curves_from_json(item)
        label = str(labels[i]) if labels else default_label(item)
        groups[label] = {k: v for k, v in curves.items() if str(node.metric) in k}
    return groups


def plot(cfg: DictConfig) -> Path:
    """Reads ``plot.inputs``, keeps the curves matching ``plot.metric``, writes ``plot.out``."""
    out = plot_curves(load_groups(cfg, cfg.plot, "plot"), cfg.plot.out, cfg.plot.title or "")
    print(f"wrote {out}")
    return out
