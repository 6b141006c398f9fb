"""Hockey benchmark: TD-MPC2 on a CPU (``+experiment=tdmpc2_hockey_cpu``: 1M model, small planner)
trained against the weak BasicOpponent for 100k frames; win-rate curves against the weak and the strong
opponent (``eval/weak/win_rate``, ``eval/strong/win_rate``, with loss/draw rates and returns).

The run goes through the real CLI (one OpenMP thread) in a temporary directory with its own MLflow store.
It takes hours on a 2-core machine: ``--estimate`` runs a short fit instead (``--estimate-frames``) and
extrapolates the full run's wall-clock from it: training at the steady-state ``time/env_sps`` (median over
the throughput windows after the warm-up burst), plus the seeding phase and one evaluation as measured in
the short run, times the number of evaluations of the full run.

Usage: python benchmarks/tdmpc2_hockey.py [--frames 100000] [--estimate [--estimate-frames 4000]]
    [--workdir DIR [--resume]] [--out benchmarks/results/tdmpc2_hockey.json] [-- extra hydra overrides]

With ``--workdir`` the run stays on disk (``DIR/runs``, ``DIR/mlflow.db``, ``DIR/fit.log``), can be
watched while it trains and, after an interruption, continued with ``--resume``; the wall-clock figure is
then that of the resumed part only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tdmpc2_pendulum import RESULTS, machine_info, run_fit

from rl_lightning.cli import compose

EXPERIMENT = "tdmpc2_hockey_cpu"


def time_one_evaluation(run_dir: Path) -> float:
    """Seconds of one evaluation (every variant, the config's episodes) of ``run_dir``'s last checkpoint,
    through the code path of the eval callback."""
    import torch
    from omegaconf import OmegaConf

    from rl_lightning.cli.run import build_module, env_config
    from rl_lightning.training.evaluation import evaluate_variants
    from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

    torch.set_num_threads(1)
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.ckpt")
    cfg = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    env_cfg = env_config(cfg)
    module = build_module(cfg, env_cfg)
    module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"])
    variants = OmegaConf.to_container(cfg.eval.variants)
    start = time.perf_counter()
    evaluate_variants(module, env_cfg, int(cfg.eval.episodes), int(cfg.eval.seed), variants)
    return time.perf_counter() - start


def estimate(frames: int, short_frames: int, overrides: list[str], workdir: Path) -> dict[str, object]:
    """Wall-clock estimate of a ``frames``-frame run from a ``short_frames`` run with the same settings."""
    cfg = compose([f"+experiment={EXPERIMENT}", *overrides])
    short_overrides = [f"total_frames={short_frames}", "eval.every_frames=0", *overrides]
    short = run_fit(EXPERIMENT, short_overrides, workdir, "short")
    warmup = cfg.collect.warmup_frames
    sps_windows = [v for f, v in short["metrics"].get("time/env_sps", []) if f > warmup]
    if not sps_windows:
        raise RuntimeError("no throughput window after the warm-up; raise --estimate-frames")
    sps = statistics.median(sps_windows)
    eval_s = time_one_evaluation(workdir / short["summary"]["run_dir"])
    # The short run is startup + seeding (random frames, update burst) + steady frames + one evaluation.
    fixed_s = short["wall_s"] - (short_frames - warmup) / sps - eval_s
    n_evals = frames // cfg.eval.every_frames + 1 if cfg.eval.every_frames else 1
    total_s = fixed_s + (frames - warmup) / sps + n_evals * eval_s
    return {
        "short_run": {"frames": short_frames, "wall_s": short["wall_s"], "summary": short["summary"]},
        "steady_env_sps": round(sps, 2),
        "startup_and_seeding_s": round(fixed_s, 1),
        "one_evaluation_s": round(eval_s, 1),
        "evaluations_in_full_run": n_evals,
        "estimated_wall_h": round(total_s / 3600, 2),
    }


def main() -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--estimate", action="store_true", help="short run + extrapolation only")
    parser.add_argument("--estimate-frames", type=int, default=4000)
    parser.add_argument("--out", type=Path, default=RESULTS / "tdmpc2_hockey.json")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the run (checkpoints, MLflow store) here, not in a temp dir",
    )
    parser.add_argument(
        "--resume", action="store_true", help="continue the run in --workdir from its last checkpoint"
    )
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides (after --)")
    args = parser.parse_args()

    overrides = [f"seed={args.seed}", *args.overrides]
    result: dict[str, object] = {
        "benchmark": "tdmpc2_hockey",
        "command": f"python -m rl_lightning fit +experiment={EXPERIMENT} total_frames={args.frames} "
        + " ".join(overrides),
        "machine": machine_info(),
    }
    if args.resume and args.workdir is None:
        parser.error("--resume needs the --workdir of the interrupted run")
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        tmp = args.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="tdmpc2_hockey_"))
        if args.estimate:
            result["estimate"] = estimate(args.frames, args.estimate_frames, overrides, Path(tmp))
        else:
            resume = ["ckpt_path=last"] if args.resume else []
            log_name = f"fit-resume-{int(time.time())}" if args.resume else "fit"
            res = run_fit(
                EXPERIMENT, [f"total_frames={args.frames}", *overrides, *resume], Path(tmp), log_name
            )
            metrics = res["metrics"]
            result.update(
                {
                    "frames": res["summary"]["frames"],
                    "updates": res["summary"]["updates"],
                    "wall_s": res["wall_s"],
                    "curves": {
                        k: metrics[k]
                        for k in sorted(metrics)
                        if k.startswith(("eval/weak/", "eval/strong/")) or k == "train/episode_return"
                    },
                    "final": {k: v[-1][1] for k, v in metrics.items() if k.startswith("eval/")},
                }
            )
    result["benchmark_wall_s"] = round(time.perf_counter() - start, 1)
    result["load_average_after"] = [round(x, 2) for x in __import__("os").getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("curves", "machine")}, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
