"""Scaling out on this machine: DDP over processes, and multi-process collection inside one process.

1. ``ddp``: ``fit +experiment=dqn_cartpole`` (50k frames in total) with ``trainer=ddp`` (2 CPU processes,
   gloo) and, back to back on the same seed, in one process: wall time, frames/s, the first frame count
   with an evaluation mean >= 475 and the best evaluation, from each run's MLflow store.
2. ``collection``: the hockey experiment's collector (``sac_hockey``'s module acting, the weak opponent)
   in one process against TorchRL's ``MultiSyncCollector`` over 2 workers (``collect.workers=2``), the same
   number of envs in total: env frames/s over ``--collect-frames`` frames after one warm-up collection,
   interleaved rounds, median.

    python benchmarks/scaling.py [--part ddp collection] [--seeds 0 1] [--workdir /tmp/rl_lightning_scaling]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import mlflow
from _common import write

THRESHOLD = 475.0


def fit(cwd: Path, *args: str) -> tuple[dict, float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rl_lightning", "fit", *args], cwd=cwd, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.perf_counter() - start


def curve(workdir: Path, run_dir: str) -> list[tuple[int, float]]:
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / run_dir / "mlflow_run_id").read_text().strip()
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, "eval/return_mean"))


def ddp(seeds: list[int], workdir: Path) -> dict:
    rows = []
    for seed in seeds:
        for mode, extra in (("ddp_2_processes", ["trainer=ddp"]), ("one_process", [])):
            summary, wall = fit(
                workdir, "+experiment=dqn_cartpole", f"seed={seed}", "progress_bar=false", "device=cpu",
                f"name=scaling_{mode}_s{seed}", "eval.every_frames=2500", *extra,
            )  # fmt: skip
            points = curve(workdir, summary["run_dir"])
            rows.append(
                {
                    "mode": mode,
                    "seed": seed,
                    "wall_s": wall,
                    "frames": summary["frames"],
                    "frames_per_s": summary["frames"] / wall,
                    "updates": summary["updates"],
                    "best_eval": max(v for _, v in points),
                    "first_at_475": next((f for f, v in points if v >= THRESHOLD), None),
                    "eval_curve": points,
                }
            )
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "eval_curve"}), flush=True)
    by = {m: [r for r in rows if r["mode"] == m] for m in ("ddp_2_processes", "one_process")}
    return {
        "runs": rows,
        "ddp_best_eval_ge_475": sum(r["best_eval"] >= THRESHOLD for r in by["ddp_2_processes"]),
        "wall_ratio_ddp_over_one": statistics.mean(r["wall_s"] for r in by["ddp_2_processes"])
        / statistics.mean(r["wall_s"] for r in by["one_process"]),
    }


def collection(rounds: int, frames: int) -> dict:
    import torch

    from rl_lightning.cli import compose
    from rl_lightning.cli.run import build_run

    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {"one_process": [], "multisync_2_workers": []}
    for _ in range(rounds):
        for mode, workers in (("one_process", 0), ("multisync_2_workers", 2)):
            cfg = compose(
                ["+experiment=sac_hockey", "logger=none", "device=cpu", "env.num_envs=2",
                 f"collect.workers={workers}", "env.num_envs=1" if workers else "env.num_envs=2",
                 "collect.frames_per_batch=64", "collect.warmup_frames=0"]
            )  # fmt: skip
            run = build_run(cfg)
            dm = run.datamodule
            run.trainer.strategy.connect(run.module)
            dm.setup("fit")
            collector = dm.start_collection().collector
            it = iter(collector)
            next(it)  # warm-up: workers started, first policy call done
            start, seen = time.perf_counter(), 0
            while seen < frames:
                if workers:
                    collector.update_policy_weights_()
                seen += next(it).numel()
            rates[mode].append(seen / (time.perf_counter() - start))
            collector.shutdown()
            print(mode, round(rates[mode][-1]), "frames/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "frames_per_s": rates,
        "median_frames_per_s": med,
        "ratio_workers_over_one": med["multisync_2_workers"] / med["one_process"],
        "note": "hockey vs weak, sac_hockey's actor acting, 2 envs in total either way",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["ddp", "collection"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--collect-frames", type=int, default=6000)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rl_lightning_scaling"))
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    result: dict = {}
    if "collection" in args.part:
        result["collection"] = collection(args.rounds, args.collect_frames)
    if "ddp" in args.part:
        result["ddp"] = ddp(args.seeds, args.workdir)
    print(write("scaling", result))


if __name__ == "__main__":
    main()
