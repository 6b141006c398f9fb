"""Learning benchmark: TD-MPC2 (``+experiment=tdmpc2_pendulum``) reaches an eval return of -200 on
Pendulum-v1 within 15k frames on at least 2 of 3 seeds.

Each seed is one ``python -m rl_lightning fit`` run (the real CLI, one OpenMP thread) in a temporary
directory with its own MLflow store; the eval curve (``eval/return_mean`` against frames) is read back from
it. ``--budget-min`` skips the remaining seeds once the next one would not fit (estimated from the seeds
already run), so the result may hold fewer seeds than asked for; it says so. ``--append`` adds seeds to an
existing result (for example shorter runs of further seeds: a seed that reaches the threshold within its
``--frames`` also reaches it within 15k).

Usage: python benchmarks/tdmpc2_pendulum.py [--seeds 0 1 2] [--frames 15000] [--budget-min 40]
    [--out benchmarks/results/tdmpc2_pendulum.json] [--append] [-- extra hydra overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import machine as machine_info

RESULTS = Path(__file__).resolve().parent / "results"
#: The criterion counts a seed that reaches the threshold within this many frames (runs may be shorter).
CRITERION_FRAMES = 15_000


def run_fit(experiment: str, overrides: list[str], workdir: Path, log_name: str) -> dict[str, object]:
    """One ``fit`` through the CLI in ``workdir``; returns its summary line, wall-clock and metric history.

    Returns:
        ``summary`` (the CLI's final JSON line), ``wall_s``, ``metrics`` (name -> ``[[frames, value], ...]``)
        and ``log`` (the path of the combined stdout/stderr).
    """
    import mlflow

    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{log_name}.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "rl_lightning", "fit", f"+experiment={experiment}", "progress_bar=false"]
    start = time.perf_counter()
    with log.open("w") as fh:
        proc = subprocess.run([*cmd, *overrides], cwd=workdir, stdout=fh, stderr=subprocess.STDOUT, env=env)
    wall = time.perf_counter() - start
    lines = log.read_text().strip().splitlines()
    if proc.returncode != 0:
        raise RuntimeError(f"fit failed (exit {proc.returncode}); see {log}:\n" + "\n".join(lines[-20:]))
    summary = json.loads(lines[-1])
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("rl_lightning").experiment_id])
    wanted = [k for k in run.data.metrics if k.startswith(("eval/", "train/episode_return", "time/"))]
    metrics = {}
    for key in wanted:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        metrics[key] = [[m.step, m.value] for m in history]
    return {"summary": summary, "wall_s": round(wall, 1), "metrics": metrics, "log": str(log)}


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--frames", type=int, default=15_000)
    parser.add_argument("--threshold", type=float, default=-200.0)
    parser.add_argument("--budget-min", type=float, default=None, help="skip seeds that would not fit")
    parser.add_argument("--out", type=Path, default=RESULTS / "tdmpc2_pendulum.json")
    parser.add_argument("--append", action="store_true", help="add these seeds to the seeds already in --out")
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args()

    machine = machine_info()
    overrides = [f"total_frames={args.frames}", *args.overrides]
    seeds: list[dict[str, object]] = []
    skipped: list[int] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tdmpc2_pendulum_") as tmp:
        for seed in args.seeds:
            elapsed = time.perf_counter() - start
            per_seed = elapsed / len(seeds) if seeds else 0.0
            if args.budget_min is not None and seeds and elapsed + per_seed > 60 * args.budget_min:
                skipped.append(seed)
                continue
            res = run_fit("tdmpc2_pendulum", [f"seed={seed}", *overrides], Path(tmp) / f"seed{seed}", "fit")
            curve = res["metrics"].get("eval/return_mean", [])
            reached = next((int(f) for f, v in curve if v >= args.threshold), None)
            seeds.append(
                {
                    "seed": seed,
                    "overrides": overrides,
                    "wall_s": res["wall_s"],
                    "frames": res["summary"]["frames"],
                    "updates": res["summary"]["updates"],
                    "eval_return_curve": curve,
                    "train_return_curve": res["metrics"].get("train/episode_return", []),
                    "frames_to_threshold": reached,
                    "reached": reached is not None and reached <= CRITERION_FRAMES,
                }
            )
            print(json.dumps({k: v for k, v in seeds[-1].items() if not k.endswith("curve")}), flush=True)
    if args.append and args.out.is_file():
        # Earlier seeds keep their own settings (each entry's overrides and frames).
        earlier = json.loads(args.out.read_text())
        seeds = [s for s in earlier["seeds"] if s["seed"] not in args.seeds] + seeds
        skipped = [s for s in earlier["seeds_skipped_for_time_budget"] if s not in args.seeds] + skipped
    n_reached = sum(bool(s["reached"]) for s in seeds)
    result = {
        "benchmark": "tdmpc2_pendulum",
        "criterion": f"eval/return_mean >= {args.threshold} within {CRITERION_FRAMES} frames, 2 of 3 seeds",
        "command": "python -m rl_lightning fit +experiment=tdmpc2_pendulum seed=S [each seed's overrides]",
        "machine": machine,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "seeds": sorted(seeds, key=lambda s: s["seed"]),
        "seeds_skipped_for_time_budget": skipped,
        "seeds_reached": n_reached,
        "passed": n_reached >= 2,
        "wall_s_total": round(sum(float(s["wall_s"]) for s in seeds), 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{n_reached}/{len(seeds)} seeds reached {args.threshold}; written to {args.out}")


if __name__ == "__main__":
    main()
