"""Where a whole ``fit`` spends its time: cProfile over the real CLI, summed by part of the loop.

    python benchmarks/profile_fit.py [+experiment=dqn_cartpole seed=0 ...] [--out DIR]

Runs ``python -m rl_lightning fit ARGS progress_bar=false`` in this process under cProfile (with the
default MLflow logger, whose store is created in DIR on the first run), writes the raw profile
(``DIR/fit.prof``: open it with ``python -m pstats`` or snakeviz) and
``benchmarks/results/profile_fit_<experiment>.json``: the cumulative seconds of each part (start-up,
MLflow's set-up and writes, collection, replay sampling, the update and its loss / backward / optimizer
step, evaluation, checkpoints, the rest of Lightning's loop) and its share of the run. cProfile adds a
cost per Python call, so the Python-heavy parts (the collector, TensorDict plumbing) weigh more here than
in a plain run; compare shares between runs of this script, not with wall times of unprofiled runs. A
sampling profile of an unmodified run: ``py-spy record -f raw -o fit.txt -- python -m rl_lightning fit
ARGS`` (``pip install py-spy``).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
import time
from pathlib import Path

from _common import experiment_of, write

#: Part of the run -> the (file suffix, function name) whose cumulative time measures it.
PARTS = {
    "fit_total": ("lightning/pytorch/trainer/trainer.py", "fit"),
    "collection": ("torchrl/collectors/_base.py", "__iter__"),
    "replay_sampling": ("torchrl/data/replay_buffers/replay_buffers/base.py", "sample"),
    "update": ("rl_lightning/algos/base.py", "training_step"),
    "update_backward": ("rl_lightning/algos/base.py", "backward_loss"),
    "update_optimizer_step": ("torch/optim/adam.py", "step"),  # every algorithm steps Adam
    "evaluation": ("rl_lightning/training/evaluation.py", "evaluate_variants"),
    "checkpoints": ("lightning/pytorch/trainer/trainer.py", "save_checkpoint"),
    "mlflow_setup": ("rl_lightning/cli/run.py", "make_logger"),
    "mlflow_writes": ("rl_lightning/training/mlflow_logger.py", "flush"),
}


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """The largest cumulative time of a function matching ``suffix``/``name`` (the outermost call site)."""
    times = [
        entry[3]
        for (path, _, func), entry in stats.stats.items()  # type: ignore[attr-defined]
        if path.replace("\\", "/").endswith(suffix) and func == name
    ]
    return max(times, default=0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("overrides", nargs="*", default=["+experiment=dqn_cartpole", "seed=0"])
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_profile")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import os

    os.chdir(args.out)
    start = time.perf_counter()
    profiler = cProfile.Profile()
    profiler.enable()
    from rl_lightning.cli import main as cli

    code = cli(["fit", *args.overrides, "progress_bar=false"])
    profiler.disable()
    wall = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"fit exited with {code}")
    profiler.dump_stats(args.out / "fit.prof")
    stats = pstats.Stats(str(args.out / "fit.prof"))
    parts = {name: cumulative(stats, *where) for name, where in PARTS.items()}
    parts["startup_and_teardown"] = wall - parts["fit_total"]
    accounted = sum(parts[k] for k in ("collection", "update", "evaluation", "checkpoints"))
    parts["lightning_loop_and_rest"] = parts["fit_total"] - accounted
    experiment = experiment_of(args.overrides)
    print(
        write(
            f"profile_fit_{experiment}",
            {
                "overrides": args.overrides,
                "wall_s_under_cprofile": round(wall, 1),
                "seconds": {k: round(v, 1) for k, v in parts.items()},
                "share_of_wall": {k: round(v / wall, 3) for k, v in parts.items()},
                "note": "update includes the replay sampling of its round (the data path hands a round of "
                "samples to training_step); collection: the TorchRL collector's iterator (env steps, "
                "acting); mlflow_setup (the logger and its store) is part of startup_and_teardown, "
                "mlflow_writes of lightning_loop_and_rest",
            },
        )
    )


if __name__ == "__main__":
    main()
