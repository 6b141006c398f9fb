"""Learning benchmark of the distributional family: one experiment, several seeds, through the real CLI.

For each seed: ``python -m rl_lightning fit +experiment=NAME seed=S eval.every_frames=E`` in a work
directory with its own MLflow store, the eval curve (``eval/return_mean`` against frames) read back from
it, the first frame count at which it reaches ``--threshold``, the best and the final evaluation, the
wall-clock, and (``--eval-episodes``) ``evaluate`` of the best checkpoint over that many new episodes.
On CartPole the result also holds DQN's figures for the same seeds, read from
``benchmarks/results/dqn_cartpole.json`` (not rerun).

    python benchmarks/quantile_learning.py qrdqn_cartpole [--seeds 0 1 2] [--threshold 475]
        [--within 50000] [--eval-every 2500] [--eval-episodes 100] [--workdir DIR] [--append]
        [-- extra hydra overrides]

Writes ``benchmarks/results/<experiment>.json`` (``--out-name`` to change it).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import mlflow
from _common import RESULTS, cli, write


def run_seed(experiment: str, seed: int, args: argparse.Namespace) -> dict:
    workdir = args.workdir / f"{experiment}_s{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "log.txt"
    overrides = [f"seed={seed}", "progress_bar=false", f"eval.every_frames={args.eval_every}", *args.extra]
    start = time.perf_counter()
    summary = json.loads(cli(workdir, log, "fit", f"+experiment={experiment}", *overrides))
    wall = time.perf_counter() - start
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
    curve = sorted([int(m.step), m.value] for m in client.get_metric_history(run_id, "eval/return_mean"))
    within = [(f, v) for f, v in curve if f <= args.within]
    first = next((f for f, v in within if v >= args.threshold), None)
    entry = {
        "seed": seed,
        "overrides": overrides,
        "wall_s": round(wall, 1),
        "frames": summary["frames"],
        "updates": summary["updates"],
        "first_reached_at_frames": first,
        "reached_within_budget": first is not None,
        "best_eval": max(v for _, v in within),
        "final_eval": within[-1][1],
        "eval_curve": curve,
    }
    if args.eval_episodes:
        best = workdir / summary["run_dir"] / "checkpoints" / "best.ckpt"
        line = cli(workdir, log, "evaluate", f"ckpt={best}", f"episodes={args.eval_episodes}", "logger=none")
        ev = json.loads(line)
        entry[f"best_ckpt_{args.eval_episodes}_episodes"] = {
            k: ev[k] for k in ("return_mean", "return_std", "length_mean") if k in ev
        }
    return entry


def dqn_same_seeds(seeds: list[int]) -> list[dict] | None:
    """DQN's CartPole figures for ``seeds`` from its own benchmark result, if it has them."""
    path = RESULTS / "dqn_cartpole.json"
    if not path.is_file():
        return None
    out = []
    for s in json.loads(path.read_text()).get("seeds", []):
        if s["seed"] in seeds:
            curve = s.get("eval_curve") or []
            out.append(
                {
                    "seed": s["seed"],
                    "first_reached_at_frames": s.get("solved_at_frames"),
                    "best_eval": max((v for _, v in curve), default=None),
                    "final_eval": curve[-1][1] if curve else None,
                }
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--threshold", type=float, default=475.0)
    parser.add_argument("--within", type=int, default=50_000, help="frames within which to reach it")
    parser.add_argument("--eval-every", type=int, default=2500)
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_quantile")
    parser.add_argument("--out-name", default=None)
    parser.add_argument("--append", action="store_true", help="keep the seeds of an existing result")
    parser.add_argument("extra", nargs="*", help="extra hydra overrides for every run (after --)")
    args = parser.parse_intermixed_args()  # the overrides after --, behind the options
    name = args.out_name or args.experiment
    seeds = []
    for seed in args.seeds:
        seeds.append(run_seed(args.experiment, seed, args))
        print(json.dumps({k: v for k, v in seeds[-1].items() if k != "eval_curve"}), flush=True)
    path = RESULTS / f"{name}.json"
    if args.append and path.is_file():
        seeds = [s for s in json.loads(path.read_text())["seeds"] if s["seed"] not in args.seeds] + seeds
    seeds.sort(key=lambda s: s["seed"])
    extra = " ".join(args.extra)
    seed_list = " ".join(map(str, args.seeds))
    result = {
        "experiment": args.experiment,
        "criterion": f"eval/return_mean (10 episodes) >= {args.threshold} within {args.within} frames",
        "command": (
            f"python benchmarks/quantile_learning.py {args.experiment} --seeds {seed_list} "
            f"--threshold {args.threshold:g} --within {args.within} --eval-every {args.eval_every} "
            f"--eval-episodes {args.eval_episodes}" + (f" -- {extra}" if extra else "")
        ),
        "run_command": f"python -m rl_lightning fit +experiment={args.experiment} seed=S "
        f"eval.every_frames={args.eval_every}" + (f" {extra}" if extra else ""),
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seeds": seeds,
        "reached": f"{sum(s['reached_within_budget'] for s in seeds)}/{len(seeds)}",
        "wall_s_mean": round(sum(s["wall_s"] for s in seeds) / len(seeds), 1),
    }
    if "cartpole" in args.experiment:
        result["dqn_same_seeds"] = dqn_same_seeds([s["seed"] for s in seeds])
    print(write(name, result))


if __name__ == "__main__":
    main()
