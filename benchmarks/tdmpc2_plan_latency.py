"""Planning latency of TD-MPC2: wall time of one ``act`` call (encode + the whole MPPI plan) per action.

The module is built from ``+experiment=tdmpc2_hockey`` (hockey's 18-dim observation, 4-dim action) with
the reference planner (6 iterations, 512 samples, 24 policy-prior, 64 elites, horizon 3), for the 5M and
the 1M model, eager (no compile, no CUDA graphs), on the CPU and, where there is one, the GPU. Warm-up
calls are excluded; the median over the timed calls is the figure (the machine may be shared), with min
and mean beside it. On CUDA every call is synchronised, so the figure is the full latency of an action.

Usage: python benchmarks/tdmpc2_plan_latency.py [--calls 30] [--warmup 5] [--threads 1]
    [--num-envs 1 8] [--out benchmarks/results/tdmpc2_plan_latency.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tdmpc2_pendulum import RESULTS, machine_info

from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config


def latency(size: str, device: str, num_envs: int, calls: int, warmup: int) -> dict[str, object]:
    """Times ``module.act`` for ``num_envs`` envs; returns milliseconds per call."""
    cfg = compose(
        ["+experiment=tdmpc2_hockey", f"algo.model_size={size}", f"env.num_envs={num_envs}", "logger=none"]
    )
    module = build_module(cfg, env_config(cfg)).to(device)
    module.train()
    obs = torch.randn(num_envs, module.obs_shape[0], device=device)
    steps = torch.ones(num_envs, 1, dtype=torch.int64, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for i in range(warmup + calls):
        td = TensorDict({"observation": obs, "step_count": steps}, [num_envs], device=device)
        sync()
        start = time.perf_counter()
        module.act(td)
        sync()
        if i >= warmup:
            times.append(1e3 * (time.perf_counter() - start))
    hp = module.hparams
    return {
        "model": size,
        "params_m": round(module.model.num_params() / 1e6, 2),
        "device": device,
        "num_envs": num_envs,
        "planner": {k: hp[k] for k in ("horizon", "iterations", "num_samples", "num_pi_trajs", "num_elites")},
        "ms_median": round(statistics.median(times), 2),
        "ms_min": round(min(times), 2),
        "ms_mean": round(statistics.fmean(times), 2),
        "ms_per_env_median": round(statistics.median(times) / num_envs, 2),
        "calls": calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1])
    parser.add_argument("--out", type=Path, default=RESULTS / "tdmpc2_plan_latency.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for device in devices:
        for size in ("5M", "1M"):
            for n in args.num_envs:
                rows.append(latency(size, device, n, args.calls, args.warmup))
                print(json.dumps(rows[-1]), flush=True)
    result = {
        "benchmark": "tdmpc2_plan_latency",
        "what": "ms per act() call: encode + full MPPI plan, eager, warm-up excluded",
        "machine": machine_info(),
        "cpu_threads": torch.get_num_threads(),
        "device_names": {
            "cpu": machine_info()["cpu"],
            **({"cuda": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {}),
        },
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
