"""Subnormal floats on the CPU: what ``flush_denormal`` (on by default) saves, and that it changes no result.

Subnormal float32 values lie below 1.2e-38. Adam's first moment of a weight whose gradient is zero (a ReLU
unit that stopped firing) decays by 0.9 per step into that range and stays there: for the smallest
subnormals ``0.9 * m`` rounds back to ``m``. Each operation on a subnormal operand takes the CPU's slow path.
``flush_denormal: true`` (the root config key, applied by every command) sets the CPU's flush-to-zero and
denormals-are-zero modes, so those moments become zero.

1. **Mechanism**, in this process, one torch thread: fused Adam steps over 65,536 parameters with zero
   gradients, the first moment normal (1e-6) or at 4 ulps of the smallest subnormal (5.6e-45), with the flag
   off and on: µs per step and the moment after the steps.
2. **Whole fits**: ``python -m rl_lightning fit`` in its own process per run, ``flush_denormal=true`` and
   ``false`` alternating (which goes first alternates with the round), ``--rounds`` rounds. DQN CartPole is
   the experiment as shipped (50k frames); SAC Pendulum runs ``--sac-frames`` frames. Per run: wall time of
   the process, the steady ms per frame (from the first evaluation to the last), the subnormal entries of the
   last checkpoint's optimizer state and whether both settings end with the same parameters, bit for bit.
   ``--tasks tdmpc2_pendulum`` adds 2500 frames of TD-MPC2 (Mish and LayerNorm, no ReLU units to go idle).

    python benchmarks/denormals.py [--tasks dqn_cartpole sac_pendulum] [--rounds 2] [--sac-frames 5000]

Writes ``benchmarks/results/denormals.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _common import write
from sb3_compare import ENV, figures, our_curve

from rl_lightning.training.safe_load import load_checkpoint

#: Task -> frames of its fits (None: the experiment's own) and the evaluation threshold of its figures.
TASKS = {
    "dqn_cartpole": {"frames": None, "threshold": 475.0},
    "sac_pendulum": {"frames": 5000, "threshold": -200.0},
    # Mish and LayerNorm, no ReLU: only with --tasks (a frame costs about 40 ms on a CPU)
    "tdmpc2_pendulum": {"frames": 2500, "threshold": -200.0, "overrides": ["eval.every_frames=1000"]},
}
DEFAULT_TASKS = ["dqn_cartpole", "sac_pendulum"]
PARAMETERS = 65_536
TINY = torch.finfo(torch.float32).tiny


def adam_step_us(first_moment: float, flush: bool, steps: int = 300) -> tuple[float, float]:
    """µs per fused Adam step over ``PARAMETERS`` parameters with zero gradients; the first moment after."""
    torch.set_flush_denormal(flush)
    try:
        param, grad = torch.randn(PARAMETERS), torch.zeros(PARAMETERS)
        exp_avg, exp_avg_sq = torch.full((PARAMETERS,), first_moment), torch.full((PARAMETERS,), 1e-10)
        step = torch.tensor(100.0)

        def run(n: int) -> None:
            for _ in range(n):
                torch._fused_adam_(
                    [param], [grad], [exp_avg], [exp_avg_sq], [], [step], amsgrad=False, lr=1e-3, beta1=0.9,
                    beta2=0.999, weight_decay=0.0, eps=1e-8, maximize=False, grad_scale=None, found_inf=None,
                )  # fmt: skip

        run(10)
        start = time.perf_counter()
        run(steps)
        return (time.perf_counter() - start) / steps * 1e6, float(exp_avg[0])
    finally:
        torch.set_flush_denormal(False)


def mechanism() -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    for flush in (False, True):
        for label, moment in (("normal", 1e-6), ("subnormal", 4 * 2.0**-149)):
            us, after = adam_step_us(moment, flush)
            rows.append({"flush_denormal": flush, "first_moment": label, "us_per_step": round(us, 1),
                         "first_moment_after": after})  # fmt: skip
    return rows


def optimizer_state(ckpt: Path) -> tuple[dict[str, int], dict[str, torch.Tensor]]:
    """Subnormal and total entries of the checkpoint's optimizer moments, and its parameters."""
    state = load_checkpoint(ckpt)
    counts = {"subnormal": 0, "zero": 0, "entries": 0}
    for optimizer in state["optimizer_states"]:
        for entry in optimizer["state"].values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in entry:
                    magnitude = entry[key].float().abs()
                    counts["subnormal"] += int(((magnitude > 0) & (magnitude < TINY)).sum())
                    counts["zero"] += int((magnitude == 0).sum())
                    counts["entries"] += magnitude.numel()
    params = {k: v for k, v in state["state_dict"].items() if v.is_floating_point()}
    return counts, params


def fit(task: str, flush: bool, workdir: Path, round_: int) -> tuple[dict, dict[str, torch.Tensor]]:
    runs = workdir / f"{'flush' if flush else 'keep'}_r{round_}"
    cwd = runs / f"ours_{task}_s0"  # where sb3_compare's our_curve looks for a run of the task
    cwd.mkdir(parents=True, exist_ok=True)
    args = [f"+experiment={task}", "seed=0", "progress_bar=false", "device=cpu", f"flush_denormal={flush}"]
    if TASKS[task]["frames"]:
        args.append(f"total_frames={TASKS[task]['frames']}")
    args += TASKS[task].get("overrides", [])
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "rl_lightning", "fit", *args], cwd=cwd, env=ENV, capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    curve = our_curve(runs, task, 0, summary["run_dir"])
    row = figures(curve, wall, summary["frames"], TASKS[task]["threshold"])
    counts, params = optimizer_state(cwd / summary["last_ckpt"])
    return {"flush_denormal": flush, "round": round_, **row, "optimizer_moments": counts}, params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS, choices=list(TASKS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sac-frames", type=int, default=TASKS["sac_pendulum"]["frames"])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_denormals")
    parser.add_argument("--tag", help="suffix of the result file name")
    args = parser.parse_args()
    TASKS["sac_pendulum"]["frames"] = args.sac_frames
    results: dict = {"adam_step": mechanism(), "fits": {}, "summary": {}}
    print(json.dumps(results["adam_step"]), flush=True)
    for task in args.tasks:
        runs, params = [], {}
        for round_ in range(args.rounds):
            for flush in (True, False) if round_ % 2 == 0 else (False, True):
                row, params[flush] = fit(task, flush, args.workdir, round_)
                runs.append(row)
                print(json.dumps(row)[:300], flush=True)
        same = params[True].keys() == params[False].keys() and all(
            torch.equal(params[True][k], params[False][k]) for k in params[True]
        )
        mean = {
            flush: {
                key: round(statistics.mean(r[key] for r in runs if r["flush_denormal"] is flush), 3)
                for key in ("wall_s", "steady_ms_per_frame")
            }
            for flush in (True, False)
        }
        results["fits"][task] = runs
        results["summary"][task] = {
            "wall_s_flush": mean[True]["wall_s"],
            "wall_s_keep": mean[False]["wall_s"],
            "steady_ms_per_frame_flush": mean[True]["steady_ms_per_frame"],
            "steady_ms_per_frame_keep": mean[False]["steady_ms_per_frame"],
            "steady_ratio_flush_over_keep": round(
                mean[True]["steady_ms_per_frame"] / mean[False]["steady_ms_per_frame"], 3
            ),
            "same_final_parameters": same,
            "same_curves": len({json.dumps(r["curve"]) for r in runs}) == 1,
        }
        print(json.dumps(results["summary"][task]), flush=True)
    name = "denormals" + (f"_{args.tag}" if args.tag else "")
    how = (
        "adam_step: in this process, one torch thread; fits: one process per run, flush_denormal=true "
        "and false alternating, seed 0, one torch thread; steady_ms_per_frame: wall time per frame from the "
        "first evaluation to the last; optimizer_moments: Adam's exp_avg and exp_avg_sq entries in last.ckpt"
    )
    print(write(name, {"how": how, **results}))


if __name__ == "__main__":
    main()
