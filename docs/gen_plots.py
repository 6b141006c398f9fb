"""Draws the learning curves of every benchmark result for the docs (docs/learning-curves.md + images).

Runs as an mkdocs hook before each build, or by hand: ``python docs/gen_plots.py``. Each result in
``benchmarks/results/`` that holds curves (see ``rl_lightning.cli.plot``) becomes one image, drawn by the
same code as ``python -m rl_lightning plot``. Under each image, the figures of
``python -m rl_lightning report`` on the same curves: per curve, the interquartile mean over the seeds of
the last and of the best evaluation (validation episodes), with 95% stratified-bootstrap intervals from 5
seeds on, the seeds' values with fewer.

An image newer than its result file and than the drawing code is kept, as ``make`` keeps a target:
drawing all of them took about 20 of a build's 26 s, and ``mkdocs serve`` builds again after each edit.
"""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
IMAGES = ROOT / "docs" / "images" / "curves"
PAGE = ROOT / "docs" / "learning-curves.md"
#: Which curves to draw where "every eval curve" would be too many panels.
METRIC = {"tdmpc2_hockey": "win_rate", "tdmpc2_hockey_rounds": "win_rate"}
#: The code that draws an image: an image older than any of them is drawn again.
DRAWING_CODE = (Path(__file__).resolve(), ROOT / "rl_lightning" / "cli" / "plot.py")


def up_to_date(image: Path, source: Path) -> bool:
    """``image`` exists and is newer than ``source`` and than :data:`DRAWING_CODE`."""
    if not image.is_file():
        return False
    drawn = image.stat().st_mtime
    return all(drawn > path.stat().st_mtime for path in (source, *DRAWING_CODE))


def interval_rows(curves: dict) -> list[str]:
    """A markdown table of ``report``'s interval estimates per curve (IQM of the last and best values)."""
    import numpy as np

    from rl_lightning.cli.report import seed_figures
    from rl_lightning.training.stats import interval_estimates

    rows = ["| curve | seeds | last: IQM [95% CI] | best: IQM [95% CI] |", "| --- | --- | --- | --- |"]
    for name, runs in curves.items():
        cells = []
        for values in seed_figures(runs).values():
            iqm = interval_estimates(np.array(values)[:, None])["iqm"]
            if iqm["low"] is None:  # too few seeds for an interval: their values
                cells.append("per seed: " + ", ".join(f"{v:.3g}" for v in values))
            else:
                cells.append(f"{iqm['value']:.3g} [{iqm['low']:.3g}, {iqm['high']:.3g}]")
        rows.append(f"| {name} | {len(runs)} | {cells[0]} | {cells[1]} |")
    return rows


def write() -> Path:
    from rl_lightning.cli.plot import curves_from_json, plot_curves

    IMAGES.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Learning curves",
        "",
        "Every learning benchmark in `benchmarks/results/`, drawn at each docs build by the code of",
        "`python -m rl_lightning plot` (mean over seeds, band from the lowest to the highest seed, against",
        "environment frames). Draw one yourself, for example:",
        "",
        "```bash",
        "python -m rl_lightning plot plot.inputs=[benchmarks/results/dqn_cartpole.json] plot.out=dqn.png",
        "python -m rl_lightning plot plot.inputs=[mlflow:dqn_cartpole] plot.metric=eval/return_mean",
        "```",
        "",
        "The curves are in-training evaluations, on the validation episodes that also chose each run's",
        "`best.ckpt` ([the evaluation protocol](evaluation.md)): a run's reported figures are its test",
        "evaluations, in the tables of the pages that cite each result. Under each figure, what",
        "`python -m rl_lightning report` gives for the same curves: the interquartile mean over the seeds",
        "of each curve's last and best value, with 95% stratified-bootstrap intervals from 5 seeds on (the",
        "seeds' values with fewer).",
        "",
    ]
    for path in sorted(RESULTS.glob("*.json")):
        metric = METRIC.get(path.stem, "eval")
        curves = {k: v for k, v in curves_from_json(path).items() if metric in k}
        if not curves:
            continue
        image = IMAGES / f"{path.stem}.png"
        if not up_to_date(image, path):
            image = plot_curves({path.stem: curves}, image, title=path.stem)
        data = json.loads(path.read_text())
        # "reproduce": today's command where the script that made the result has left the tree.
        command = data.get("reproduce") or data.get("command", "the command in docs/benchmarks.md")
        lines += [
            f"## {path.stem}",
            "",
            f"![{path.stem}](images/curves/{image.name})",
            "",
            f"From `benchmarks/results/{path.name}`; reproduce with `{command}`.",
            "",
            *interval_rows(curves),
            "",
        ]
    PAGE.write_text("\n".join(lines))
    return PAGE


def on_pre_build(config: object) -> None:  # mkdocs hook
    write()


if __name__ == "__main__":
    print(write())
