"""``TorchCompile`` on ``update``: the algorithm's losses compiled as regions, against the whole update.

    python benchmarks/compile_regions.py [--experiments td3_pendulum sac_pendulum ...] [--updates 200]

For each experiment and each way (``regions``: ``TorchCompile``'s default, the losses of ``compile_regions``
compiled and the backward passes and optimizer steps eager; ``whole``: ``regions=false``, the update compiled
whole), one real ``fit`` on the CPU with ``callbacks=[default,compile]
callbacks.compile.paths=[update]``, in a process of its own with an empty Inductor cache, so that each pays
a cold compile as a first run does. The ways alternate within each experiment. A timer wraps ``update``
outside the compiled code, and each run reports:

- ``compile_s``: the seconds its updates took beyond the steady per-update time (``sum(t) - n * median``
  of the second half): tracing and code generation wherever they happened, recompilations included (TD3's
  critic-only and full updates);
- ``first_update_s``: the first update alone (its compilation, in both ways);
- ``update_ms``: the median update of the second half (warm-up excluded);
- ``frames``: dynamo's compiled frames, and ``graph_breaks``.

Ratios regions / whole of both. Writes ``benchmarks/results/compile_regions.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import ROOT, write

EXPERIMENTS = ["td3_pendulum", "sac_pendulum", "dqn_cartpole", "tdmpc2_pendulum"]
WAYS = {"regions": "true", "whole": "false"}


def child(experiment: str, regions: str, updates: int) -> dict[str, Any]:
    """One fit in this process; returns its timings."""
    import lightning as L
    import torch

    from callbacks._protocol import restore_hot_paths, wrap_hot_path
    from rl_lightning.cli import compose
    from rl_lightning.cli.run import build_run

    times: list[float] = []

    class UpdateTimer(L.Callback):
        """Listed after the compile callback: wraps ``update`` outermost, around the compiled code."""

        def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            def timed(update: Any) -> Any:
                def run(batch: Any) -> Any:
                    start = time.perf_counter()
                    out = update(batch)
                    times.append(time.perf_counter() - start)
                    return out

                return run

            wrap_hot_path(pl_module, "update", timed, owner=self)

        def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
            restore_hot_paths(pl_module, self)

    warmup = 256
    cfg = compose([
        f"+experiment={experiment}", "device=cpu", "logger=none", "progress_bar=false", "seed=0",
        "callbacks=[default,compile]", "callbacks.compile.paths=[update]",
        f"callbacks.compile.regions={regions}",
        f"collect.warmup_frames={warmup}", "collect.warmup_burst=false", "collect.updates_per_frame=1",
        f"total_frames={warmup + updates}", "eval.every_frames=0", "eval.episodes=1",
        f"run_dir={tempfile.mkdtemp()}",
    ])  # fmt: skip
    run = build_run(cfg)
    run.trainer.callbacks.append(UpdateTimer())
    run.trainer.fit(run.module, datamodule=run.datamodule)
    steady = statistics.median(times[len(times) // 2 :])
    counters = torch._dynamo.utils.counters
    return {
        "updates": len(times),
        "compile_s": round(sum(times) - len(times) * steady, 2),
        "first_update_s": round(times[0], 2),
        "update_ms": round(steady * 1e3, 3),
        "frames": counters["frames"]["ok"],
        "graph_breaks": sum(counters["graph_break"].values()),
    }


def measure(experiment: str, regions: str, updates: int) -> dict[str, Any]:
    """:func:`child` in a new process with an empty Inductor cache and one torch thread."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "OMP_NUM_THREADS": "1"}
        env["PYTHONWARNINGS"] = "ignore"
        proc = subprocess.run(
            [sys.executable, __file__, "--child", experiment, regions, str(updates)],
            cwd=ROOT, capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{experiment} regions={regions} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiments", nargs="+", default=EXPERIMENTS)
    parser.add_argument("--updates", type=int, default=200, help="updates per fit after the random warm-up")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        experiment, regions, updates = args.child
        print(json.dumps(child(experiment, regions, int(updates))))
        return
    results: dict[str, Any] = {}
    for experiment in args.experiments:
        runs = {way: measure(experiment, flag, args.updates) for way, flag in WAYS.items()}
        runs["compile_ratio_regions_to_whole"] = round(
            runs["regions"]["compile_s"] / runs["whole"]["compile_s"], 3
        )
        runs["update_ratio_regions_to_whole"] = round(
            runs["regions"]["update_ms"] / runs["whole"]["update_ms"], 3
        )
        results[experiment] = runs
        print(experiment, json.dumps(runs), flush=True)
    path = write(
        "compile_regions",
        {
            "what": "TorchCompile on update (inductor, cold cache, CPU, one torch thread): the losses "
            "compiled as regions against the whole update compiled; compile_s = seconds the updates took "
            "beyond the steady median, update_ms = median of the second half",
            "updates": args.updates,
            "results": results,
        },
    )
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    main()
