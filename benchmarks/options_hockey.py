"""Hockey vs the weak opponent: SAC with options next to flat SAC on the same CPU-sized budget.

For each seed and each experiment (``sac_options_hockey``, ``sac_hockey``): ``python -m rl_lightning fit
+experiment=NAME seed=S total_frames=F`` in its own work directory (the same overrides for both), the
evaluation curves against both opponents from the run's MLflow store (``eval/weak/win_rate``, ...),
then ``evaluate`` of the last checkpoint over ``--episodes`` new games against each opponent (NORMAL
mode): win, loss and draw rates. For the options run also the option metrics at the end. Runs go one
after another; the wall time of each is recorded (the machine is shared, so they are upper bounds).

    python benchmarks/options_hockey.py [--seeds 0 1 2] [--frames 50000] [--episodes 50]
        [--workdir DIR] [-- extra hydra overrides for both]

Writes ``benchmarks/results/sac_options_hockey.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import mlflow
from _common import cli, write

EXPERIMENTS = ("sac_options_hockey", "sac_hockey")
OUTCOMES = ("win_rate", "loss_rate", "draw_rate")


def run_one(experiment: str, seed: int, args: argparse.Namespace) -> dict:
    workdir = args.workdir / f"{experiment}_s{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "log.txt"
    overrides = [
        f"seed={seed}", "progress_bar=false", f"total_frames={args.frames}",
        f"eval.every_frames={args.eval_every}", f"checkpoint.every_frames={args.eval_every}", *args.extra,
    ]  # fmt: skip
    start = time.perf_counter()
    summary = json.loads(cli(workdir, log, "fit", f"+experiment={experiment}", *overrides))
    wall = time.perf_counter() - start
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
    metrics = client.get_run(run_id).data.metrics
    curves = {
        key: sorted([int(m.step), round(m.value, 3)] for m in client.get_metric_history(run_id, key))
        for key in (f"eval/{o}/{r}" for o in ("weak", "strong") for r in (*OUTCOMES, "return_mean"))
    }
    last = workdir / summary["run_dir"] / "checkpoints" / "last.ckpt"
    ev = json.loads(cli(workdir, log, "evaluate", f"ckpt={last}", f"episodes={args.episodes}", "logger=none"))
    out = {
        "seed": seed,
        "overrides": overrides,
        "wall_s": round(wall, 1),
        "frames": summary["frames"],
        "updates": summary["updates"],
        f"last_ckpt_{args.episodes}_games": {
            opponent: {k: ev[f"{opponent}/{k}"] for k in (*OUTCOMES, "return_mean")}
            for opponent in ("weak", "strong")
        },
        "eval_curves": curves,
    }
    if experiment == "sac_options_hockey":
        out["options_at_end"] = {k: round(v, 4) for k, v in metrics.items() if k.startswith("options/")}
    return out


def mean_outcomes(runs: list[dict], episodes: int) -> dict:
    key = f"last_ckpt_{episodes}_games"
    return {
        opponent: {k: sum(r[key][opponent][k] for r in runs) / len(runs) for k in (*OUTCOMES, "return_mean")}
        for opponent in ("weak", "strong")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=50_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--episodes", type=int, default=50, help="games per opponent in the final evaluation")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_hockey")
    parser.add_argument("extra", nargs="*", help="extra hydra overrides for both experiments (after --)")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in EXPERIMENTS}
    for seed in args.seeds:
        for name in EXPERIMENTS:
            runs[name].append(run_one(name, seed, args))
            brief = {k: runs[name][-1][k] for k in ("seed", "wall_s", f"last_ckpt_{args.episodes}_games")}
            print(name, json.dumps(brief), flush=True)
            # Written after every run: a long comparison cut short still leaves its finished runs.
            print(write("sac_options_hockey", summarize(runs, args)))


def summarize(runs: dict[str, list[dict]], args: argparse.Namespace) -> dict:
    done = {name: r for name, r in runs.items() if r}
    return {
        "complete": all(len(r) == len(args.seeds) for r in runs.values()),
        "budget": {
            "frames": args.frames,
            "envs": 4,
            "updates_per_frame": 0.5,
            "note": "each experiment's own recipe (4 envs, 0.5 updates per frame, batch 256) cut to the "
            "frame budget a 2-core shared CPU affords; sac_hockey's own budget is 200k frames",
        },
        "mean_last_ckpt": {name: mean_outcomes(r, args.episodes) for name, r in done.items()},
        "wall_s_mean": {name: sum(x["wall_s"] for x in r) / len(r) for name, r in done.items()},
        "note": "CPU runs one after another on a 2-core machine shared with other jobs "
        "(see machine.load_avg_1m).",
        "runs": runs,
    }


if __name__ == "__main__":
    main()
