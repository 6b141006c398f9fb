"""Learning benchmark: dqn_cartpole through the real CLI on several seeds.

For each seed: ``python -m rl_lightning fit +experiment=dqn_cartpole seed=S`` (50k frames), the evaluation
curve from the run's MLflow store, the first frame count with an evaluation mean >= 475 (10 episodes), the
wall-clock of the whole run, then ``evaluate`` of its best checkpoint over 100 new episodes.

    python benchmarks/dqn_cartpole.py [--seeds 0 1 2] [--workdir /tmp/dqn_bench]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import mlflow
from _common import write

THRESHOLD, FINAL_THRESHOLD = 475.0, 450.0


def run(cwd: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "rl_lightning", *args], cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return proc.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rl_lightning_dqn_bench"))
    parser.add_argument("--extra", nargs="*", default=[], help="extra overrides for every run")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    per_seed = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        out = run(
            args.workdir,
            "fit",
            "+experiment=dqn_cartpole",
            f"seed={seed}",
            "progress_bar=false",
            f"name=dqn_cartpole_s{seed}",
            "eval.every_frames=2500",
            *args.extra,
        )
        wall = time.perf_counter() - t0
        summary = json.loads(out.strip().splitlines()[-1])
        client = mlflow.MlflowClient(f"sqlite:///{args.workdir / 'mlflow.db'}")
        run_id = (args.workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
        curve = [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/return_mean")]
        curve.sort()
        solved_at = next((f for f, v in curve if v >= THRESHOLD), None)
        best = args.workdir / summary["run_dir"] / "checkpoints" / "best.ckpt"
        ev = json.loads(
            run(args.workdir, "evaluate", f"ckpt={best}", "episodes=100", f"seed={seed}", "logger=none")
            .strip()
            .splitlines()[-1]
        )
        per_seed.append(
            {
                "seed": seed,
                "wall_s": wall,
                "frames": summary["frames"],
                "solved_at_frames": solved_at,
                "eval_curve": curve,
                "best_ckpt_100_episodes": ev,
            }
        )
        print(
            f"seed {seed}: solved at {solved_at} frames, {wall:.0f} s, best ckpt over 100 episodes "
            f"{ev['return_mean']:.1f} ± {ev['return_std']:.1f}"
        )
    result = {
        "seeds": per_seed,
        "solved_within_50k": sum(s["solved_at_frames"] is not None for s in per_seed),
        "best_ckpt_ge_450": sum(
            s["best_ckpt_100_episodes"]["return_mean"] >= FINAL_THRESHOLD for s in per_seed
        ),
        "wall_s_mean": sum(s["wall_s"] for s in per_seed) / len(per_seed),
        "reference": "Stable-Baselines3 rl-zoo DQN recipe: about 94 s of training for 50k frames here",
    }
    print(write("dqn_cartpole", result))


if __name__ == "__main__":
    main()
