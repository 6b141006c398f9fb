"""Learning benchmark over a table: experiments, frames, seeds and the published figures to compare with.

Each entry of a suite is one experiment with its overrides. Per seed it runs ``python -m rl_lightning fit``
through the real CLI in a work directory of its own (MLflow store included), reads back what the run logged
and evaluates the last checkpoint on ``--final-episodes`` new episodes:

- ``train_last100``: the mean return of the last 100 training episodes before the budget (the exploring
  policy; the statistic of the MinAtar paper's curves, a 100-episode moving average);
- ``train_mean``: the mean return of all training episodes of the run (Dopamine's per-iteration figure:
  "Revisiting Rainbow" plots it per million frames);
- ``eval_curve`` (``eval/return_mean`` against frames), ``final_eval`` (the last checkpoint, greedy), wall
  time and frames/s.

Per entry the seeds are summarised with interval estimates (interquartile mean, mean, median with 95%
stratified-bootstrap intervals) and set beside each published figure of the same statistic: ``reached``
when the seeds' mean is at least the published value.

    python benchmarks/learning.py SUITE [--only NAME ...] [--seeds 0 1 2] [--parallel 2] [--workdir DIR]
        [--out NAME] [-- extra hydra overrides]

Results accumulate in ``benchmarks/results/<SUITE>.json`` (``--out``: ``<NAME>.json``; a seed already there
is not run again unless ``--rerun``), so a suite can be run in parts. A run cut short resumes from its last
checkpoint when started again with the same ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, cli, write

from rl_lightning.training.stats import interval_estimates

LAST_EPISODES = 100


@dataclass(frozen=True)
class Published:
    """A figure from the literature at the entry's frame count."""

    statistic: str  # train_last100 | train_mean
    value: float
    source: str


@dataclass(frozen=True)
class Entry:
    """One experiment of a suite."""

    name: str
    experiment: str
    overrides: tuple[str, ...] = ()
    published: tuple[Published, ...] = field(default_factory=tuple)


_YOUNG_TIAN = (
    "Young and Tian 2019, MinAtar, Fig. 2 (kenjyoung/MinAtar README learning_curves.gif): DQN, 100-episode "
    "moving average of training returns at 1M frames, mean of 30 runs; read from the figure"
)
_REVISITING = (
    "Obando-Ceron and Castro 2021, Revisiting Rainbow, MinAtar figures (psc-g.github.io revisiting_rainbow "
    "post, 2021-05-24): mean training return over iteration 0 (frames 0-1M); read from the figure"
)

SUITES: dict[str, list[Entry]] = {
    "minatar": [
        Entry("dqn_breakout", "dqn_minatar", ("env.id=MinAtar/Breakout-v1",),
              (Published("train_last100", 9.2, _YOUNG_TIAN), Published("train_mean", 2.95, _REVISITING))),
        Entry("dqn_space_invaders", "dqn_minatar", ("env.id=MinAtar/SpaceInvaders-v1",),
              (Published("train_last100", 32.8, _YOUNG_TIAN), Published("train_mean", 15.7, _REVISITING))),
        Entry("rainbow_breakout", "rainbow_minatar", ("env.id=MinAtar/Breakout-v1",),
              (Published("train_mean", 4.55, _REVISITING),)),
        Entry("rainbow_space_invaders", "rainbow_minatar", ("env.id=MinAtar/SpaceInvaders-v1",),
              (Published("train_mean", 25.4, _REVISITING),)),
    ],
}  # fmt: skip


def episode_returns(client: Any, run_id: str) -> list[tuple[int, int, float]]:
    """``(frame, episodes, mean return)`` per logging interval of a run, from ``train/episodes`` (the running
    count) and ``train/episode_return`` (the mean over the interval's episodes, logged where there were
    some)."""
    counts = sorted(client.get_metric_history(run_id, "train/episodes"), key=lambda m: (m.step, m.timestamp))
    means = sorted(
        client.get_metric_history(run_id, "train/episode_return"), key=lambda m: (m.step, m.timestamp)
    )
    out, seen, j = [], 0, 0
    for m in counts:
        new = int(m.value) - seen
        seen = int(m.value)
        if new <= 0:
            continue
        while j < len(means) and means[j].step < m.step:
            j += 1
        if j == len(means) or means[j].step != m.step:
            raise ValueError(f"no train/episode_return logged with the {new} episodes at frame {m.step}")
        out.append((int(m.step), new, float(means[j].value)))
        j += 1
    return out


def training_statistics(intervals: list[tuple[int, int, float]]) -> dict[str, float]:
    """``train_mean`` over all intervals and ``train_last100`` over the last intervals holding at least
    :data:`LAST_EPISODES` episodes (the trailing moving average at the end of the run)."""
    counts = np.array([n for _, n, _ in intervals], dtype=float)
    sums = np.array([n * r for _, n, r in intervals])
    tail = np.cumsum(counts[::-1])
    k = int(np.searchsorted(tail, LAST_EPISODES)) + 1  # intervals from the end covering 100 episodes
    return {
        "train_mean": float(sums.sum() / counts.sum()),
        "train_last100": float(sums[-k:].sum() / counts[-k:].sum()),
        "train_episodes": int(counts.sum()),
    }


def run_seed(entry: Entry, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import mlflow

    workdir = args.workdir / entry.name / f"seed{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "log.txt"
    overrides = [f"+experiment={entry.experiment}", *entry.overrides, f"seed={seed}", "progress_bar=false",
                 *args.extra]  # fmt: skip
    if any(workdir.glob("runs/*/*/checkpoints/last.ckpt")):
        overrides.append("ckpt_path=last")  # a run cut short goes on from its last checkpoint
    start = time.perf_counter()
    summary = json.loads(cli(workdir, log, "fit", *overrides))
    wall = time.perf_counter() - start
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
    curve = sorted([int(m.step), m.value] for m in client.get_metric_history(run_id, "eval/return_mean"))
    final = json.loads(
        cli(workdir, log, "evaluate", f"ckpt={summary['last_ckpt']}", f"episodes={args.final_episodes}",
            "logger=none")
    )  # fmt: skip
    return {
        "seed": seed,
        "frames": summary["frames"],
        "updates": summary["updates"],
        "wall_s": round(wall, 1),
        "frames_per_s": round(summary["frames"] / wall, 1),
        **training_statistics(episode_returns(client, run_id)),
        "final_eval": final["return_mean"],
        "final_eval_episodes": args.final_episodes,
        "eval_curve": curve,
    }


def summarise(entry: Entry, seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Interval estimates per statistic over the seeds, and each published figure beside ours."""
    stats = ("train_last100", "train_mean", "final_eval")
    runs = list(seeds.values())
    out: dict[str, Any] = {"seeds": len(runs)}
    for stat in stats:
        out[stat] = interval_estimates(np.array([[r[stat]] for r in runs]))
    out["published"] = [
        {
            "statistic": p.statistic,
            "value": p.value,
            "source": p.source,
            "ours_mean": out[p.statistic]["mean"]["value"],
            "reached": out[p.statistic]["mean"]["value"] >= p.value,
        }
        for p in entry.published
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--only", nargs="+", help="entries of the suite to run (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one per core)")
    parser.add_argument("--final-episodes", type=int, default=100)
    parser.add_argument("--rerun", action="store_true", help="run seeds already in the results again")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_learning")
    parser.add_argument("--out", help="results file name (default: the suite's)")
    parser.add_argument("extra", nargs="*", help="hydra overrides for every run (after --)")
    args = parser.parse_intermixed_args()
    name = args.out or args.suite
    path = RESULTS / f"{name}.json"
    previous = json.loads(path.read_text())["entries"] if path.is_file() else {}
    entries = [e for e in SUITES[args.suite] if not args.only or e.name in args.only]
    jobs = [  # seed by seed: a suite cut short has every entry on its first seeds
        (e, s) for s in args.seeds for e in entries
        if args.rerun or str(s) not in previous.get(e.name, {}).get("seeds", {})
    ]  # fmt: skip
    results = {key: dict(data) for key, data in previous.items()}
    lock = threading.Lock()

    def record(job: tuple[Entry, int]) -> None:
        entry, seed = job
        outcome = run_seed(entry, seed, args)
        with lock:
            data = results.setdefault(entry.name, {"seeds": {}})
            data.update({"experiment": entry.experiment, "overrides": [*entry.overrides, *args.extra]})
            data["seeds"] = {**data.get("seeds", {}), str(seed): outcome}
            data["summary"] = summarise(entry, data["seeds"])
            write(name, {"suite": args.suite, "entries": results}, path)
        print(f"{entry.name} seed {seed}: train_last100 {outcome['train_last100']:.2f}, train_mean "
              f"{outcome['train_mean']:.2f}, final {outcome['final_eval']:.2f}", flush=True)  # fmt: skip

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(record, jobs))


if __name__ == "__main__":
    main()
