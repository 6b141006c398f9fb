"""Collection on Ray (``collect.backend=ray``) against one process and TorchRL's multi-process collector.

1. ``collection``: the experiment's collector alone (its module acting, the weights sent before every
   collection as in a fit), 2 envs in total: one process with both envs, ``MultiSyncCollector`` over 2
   worker processes, ``RayCollector`` over 2 Ray actors on a local Ray. Start-up (building the collector
   and its first batch: processes or the Ray runtime and actors) and env frames/s over
   ``--collect-frames`` frames after it; interleaved rounds, median.
2. ``fit``: the smoke run ``fit +experiment=... +debug=quick`` through the CLI for each of the three, with
   ``--fit-frames`` frames: the command's wall time and the frames/s that ``fit`` reports.

Needs Ray (``pip install 'rl_lightning[ray]'``).

    python benchmarks/ray_collect.py [--part collection fit] [--experiment dqn_cartpole] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time

from _common import write

MODES = {
    "one_process": ["collect.workers=0", "env.num_envs=2"],
    "multisync_2_workers": ["collect.workers=2", "env.num_envs=1"],
    "ray_2_actors": ["collect.backend=ray", "collect.workers=2", "env.num_envs=1"],
}
#: The line ``fit`` prints at the end: frames, seconds of the fit and its frames/s.
DONE = re.compile(r"done: (\d+) frames, \d+ updates, (\d+) s \(([\d,]+) frames/s\)")


def collection(experiment: str, rounds: int, frames: int) -> dict:
    import torch

    from rl_lightning.cli import compose
    from rl_lightning.cli.run import build_run

    torch.set_num_threads(1)
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    starts: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(rounds):
        for mode, extra in MODES.items():
            cfg = compose([
                f"+experiment={experiment}", "logger=none", "device=cpu", "collect.frames_per_batch=64",
                "collect.warmup_frames=0", *extra,
            ])  # fmt: skip
            run = build_run(cfg)
            dm = run.datamodule
            run.trainer.strategy.connect(run.module)
            dm.setup("fit")
            workers = dm.collect.workers
            t0 = time.perf_counter()
            collector = dm.start_collection().collector
            it = iter(collector)
            if workers:
                collector.update_policy_weights_()
            next(it)  # start-up: workers (or the Ray runtime and actors) up, first policy call done
            starts[mode].append(time.perf_counter() - t0)
            start, seen = time.perf_counter(), 0
            while seen < frames:
                if workers:
                    collector.update_policy_weights_()
                seen += next(it).numel()
            rates[mode].append(seen / (time.perf_counter() - start))
            collector.shutdown()
            print(mode, f"start {starts[mode][-1]:.1f} s", round(rates[mode][-1]), "frames/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "experiment": experiment,
        "frames_per_s": rates,
        "start_s": starts,
        "median_frames_per_s": med,
        "median_start_s": {k: statistics.median(v) for k, v in starts.items()},
        "ratio_ray_over_multisync": med["ray_2_actors"] / med["multisync_2_workers"],
        "ratio_ray_over_one": med["ray_2_actors"] / med["one_process"],
        "note": "2 envs in total either way, 64 frames per collection, weights sent before each",
    }


def fit(experiment: str, rounds: int, frames: int) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for mode, extra in MODES.items():
                start = time.perf_counter()
                proc = subprocess.run(
                    [sys.executable, "-m", "rl_lightning", "fit", f"+experiment={experiment}", "+debug=quick",
                     "device=cpu", f"total_frames={frames}", *extra],
                    cwd=tmp, capture_output=True, text=True,
                )  # fmt: skip
                wall = time.perf_counter() - start
                if proc.returncode != 0:
                    raise RuntimeError(proc.stderr[-3000:])
                done = re.search(DONE, proc.stdout)
                rows.append({
                    "mode": mode, "wall_s": wall, "frames": int(done[1]), "fit_s": int(done[2]),
                    "fit_frames_per_s": int(done[3].replace(",", "")),
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    return {
        "experiment": experiment,
        "frames": frames,
        "runs": rows,
        "median_wall_s": {m: statistics.median(r["wall_s"] for r in rows if r["mode"] == m) for m in MODES},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["collection", "fit"])
    parser.add_argument("--experiment", default="dqn_cartpole")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--collect-frames", type=int, default=6000)
    parser.add_argument("--fit-frames", type=int, default=500)
    args = parser.parse_args()
    result: dict = {}
    if "collection" in args.part:
        result["collection"] = collection(args.experiment, args.rounds, args.collect_frames)
    if "fit" in args.part:
        result["fit"] = fit(args.experiment, args.rounds, args.fit_frames)
    print(write("ray_collect", result))


if __name__ == "__main__":
    main()
