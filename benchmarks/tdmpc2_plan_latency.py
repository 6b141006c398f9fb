"""Planning latency of TD-MPC2: wall time of one ``act`` call (encode + the whole MPPI plan) per action.

The module is built from ``+experiment=tdmpc2_hockey`` (hockey's 18-dim observation, 4-dim action) with
the reference planner (6 iterations, 512 samples, 24 policy-prior, 64 elites, horizon 3), for the 5M and
the 1M model, on the CPU and, where there is one, the GPU. Warm-up calls are excluded; the median over the
timed calls is the figure (the machine may be shared), with min and mean beside it. On CUDA every call is
synchronised, so the figure is the full latency of an action.

Variants (``--variants``), each the mechanism the training callbacks use on ``act``:
- ``eager``: no compile, no CUDA graphs.
- ``compiled``: ``torch.compile(act)`` with ``TorchCompile``'s defaults (mode ``default``, ``dynamic=False``).
- ``cuda_graphs`` (CUDA only): ``act`` captured and replayed by ``CudaGraphs``' ``GraphedPath``.
- ``compiled_graphs`` (CUDA only): the compiled ``act`` captured by ``GraphedPath``, as ``callbacks=fast``.
Precisions (``--precisions``, CUDA only beyond ``fp32``): ``tf32`` switches on TF32 matmuls as the ``TF32``
callback does; ``bf16`` adds ``torch.autocast(bfloat16)`` around ``act`` inside the compiled and graphed
region, as ``MixedPrecision`` listed before ``TorchCompile`` does.
``--compile-mode`` sets ``torch.compile``'s mode for the compiled variants (``default``, as ``TorchCompile``
by default, or ``max-autotune-no-cudagraphs``, which times candidate kernels for each matrix product and
may generate Triton ones). One mode per run: two compiled copies of ``act`` would share its code's compile
cache. ``compile_s`` is the wall time of the first (compiling) call. ``--kernels`` adds, on CUDA, the device
kernels one plan of each variant runs (count, summed kernel time and the costliest, from ``torch.profiler``).
The eager plan's are the floor a graphed plan cannot go under unless compile fuses kernels; the compiled
plan's say how many kernels compile left and which ones its time goes to; a graphed plan's are the kernels
the profiler sees inside a replay.

Usage: python benchmarks/tdmpc2_plan_latency.py [--calls 30] [--warmup 5] [--threads 1]
    [--num-envs 1 8] [--sizes 5M 1M] [--devices cpu cuda] [--variants eager compiled cuda_graphs
    compiled_graphs] [--precisions fp32 tf32 bf16] [--kernels]
    [--compile-mode default|max-autotune-no-cudagraphs]
    [--out benchmarks/results/tdmpc2_plan_latency.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, command_line, relative_paths
from _common import machine as machine_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from callbacks._graphed_path import GraphedPath
from callbacks.torch_compile import GRAPH_MODES, MODES
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config

VARIANTS = ("eager", "compiled", "cuda_graphs", "compiled_graphs")
#: ``TorchCompile``'s modes that leave CUDA graphs to ``GraphedPath`` (the others record their own).
COMPILE_MODES = tuple(mode for mode in MODES if mode not in GRAPH_MODES)
PLANNER_KEYS = ("horizon", "iterations", "num_samples", "num_pi_trajs", "num_elites")
CUDA_ONLY = ("cuda_graphs", "compiled_graphs")
PRECISIONS = ("fp32", "tf32", "bf16")


def set_precision(precision: str) -> None:
    """TF32 matmuls on or off (the ``TF32`` callback's switches); ``bf16`` runs on TF32 as well."""
    on = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def with_autocast(act, device: str):
    def run(td):
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False):
            return act(td)

    return run


def planning_module(
    size: str | None, num_envs: int, device: str, experiment: str = "tdmpc2_hockey"
) -> tuple[torch.nn.Module, Callable[[], TensorDict]]:
    """The experiment's TD-MPC2 module (at ``size``; ``None``: the experiment's) in train mode, and a function
    returning an observation batch for its ``act``."""
    sized = [f"algo.model_size={size}"] if size else []
    cfg = compose([f"+experiment={experiment}", *sized, f"env.num_envs={num_envs}", "logger=none"])
    module = build_module(cfg, env_config(cfg)).to(device)
    module.train()
    obs = torch.randn(num_envs, module.obs_shape[0], device=device)
    steps = torch.ones(num_envs, 1, dtype=torch.int64, device=device)
    return module, lambda: TensorDict({"observation": obs, "step_count": steps}, [num_envs], device=device)


def graphed(act, device: str):
    """``act`` captured in a CUDA graph after 3 warm-up calls, as the ``CudaGraphs`` callback does."""
    return GraphedPath(act, "act", warmup=3, device=torch.device(device), step_counter=lambda: 0,
                       add_steps=lambda n: None)  # fmt: skip


def timed(act, td, device: str) -> float:
    """Seconds of one ``act(td)`` call, the device synchronised before and after."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    act(td)
    sync()
    return time.perf_counter() - start


def wrapped_act(
    module: torch.nn.Module, variant: str, device: str, precision: str = "fp32", compile_mode: str = "default"
):
    """``module.act`` as the variant's callbacks would leave it."""
    act = module.act
    if precision == "bf16":
        act = with_autocast(act, device)
    if variant in ("compiled", "compiled_graphs"):
        act = torch.compile(act, mode=compile_mode, fullgraph=False, dynamic=False)
    if variant in CUDA_ONLY:
        act = graphed(act, device)
    return act


def kernels(act, td_fn, calls: int = 5) -> dict[str, object]:
    """Device kernels per plan: count, summed kernel time and the five costliest by total time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            act(td_fn())
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_name: dict[str, float] = {}
    for e in events:
        per_name[e.name] = per_name.get(e.name, 0.0) + e.device_time
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:5]
    return {
        "kernels_per_plan": len(events) / calls,
        "kernel_ms_per_plan": round(sum(e.device_time for e in events) / calls / 1e3, 3),
        "top_kernels_ms_per_plan": {name[:80]: round(t / calls / 1e3, 3) for name, t in top},
    }


def latency(
    size: str,
    device: str,
    num_envs: int,
    calls: int,
    warmup: int,
    variant: str = "eager",
    kernel_table: bool = False,
    precision: str = "fp32",
    compile_mode: str = "default",
) -> dict[str, object]:
    """Times ``module.act`` for ``num_envs`` envs: a row of milliseconds per call (or, where the variant
    fails to compile or capture, a row with its error)."""
    module, td_fn = planning_module(size, num_envs, device)
    if device == "cuda":
        set_precision(precision)
    compiled = variant.startswith("compiled")
    row = {"variant": variant, "precision": precision, "compile_mode": compile_mode if compiled else None}
    try:
        act = wrapped_act(module, variant, device, precision, compile_mode)
        first = timed(act, td_fn(), device)
        for _ in range(warmup - 1):
            timed(act, td_fn(), device)
    except Exception as err:
        return {**row, "error": repr(err)[:1000]}
    times = [1e3 * timed(act, td_fn(), device) for _ in range(calls)]
    extra = kernels(act, td_fn) if kernel_table and device == "cuda" else {}
    hp = module.hparams
    return {
        **row,
        "compile_s": round(first, 1) if compiled else None,
        **extra,
        "model": size,
        "params_m": round(module.model.num_params() / 1e6, 2),
        "device": device,
        "num_envs": num_envs,
        "planner": {k: hp[k] for k in PLANNER_KEYS},
        "ms_median": round(statistics.median(times), 2),
        "ms_min": round(min(times), 2),
        "ms_mean": round(statistics.fmean(times), 2),
        "ms_per_env_median": round(statistics.median(times) / num_envs, 2),
        "calls": len(times),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1])
    parser.add_argument("--sizes", nargs="+", default=["5M", "1M"])
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda if there is one")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["eager"])
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["fp32"])
    parser.add_argument("--kernels", action="store_true", help="on CUDA, profile the plan's kernels")
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default="default",
        help="torch.compile's mode for the compiled variants (one per run: they share act's code)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "tdmpc2_plan_latency.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices and not torch.cuda.is_available():
        parser.error("--devices cuda: no CUDA device here")
    rows = []
    for device in devices:
        for size in args.sizes:
            for n in args.num_envs:
                for precision in args.precisions if device == "cuda" else ["fp32"]:
                    for variant in args.variants:
                        if variant in CUDA_ONLY and device != "cuda":
                            continue
                        row = latency(size, device, n, args.calls, args.warmup, variant, args.kernels,
                                      precision, args.compile_mode)  # fmt: skip
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    result = {
        "benchmark": "tdmpc2_plan_latency",
        "what": "ms per act() call: encode + full MPPI plan, warm-up excluded",
        "command": relative_paths(command_line()),
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
