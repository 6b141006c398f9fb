"""TD-MPC2's plan under ``torch.compile``: compile time and speed, the MPPI iteration compiled once (a nested
compile region) against the loop unrolled into one graph.

The planner's ``forward`` calls ``MPPIPlanner._iterate``, its iteration marked as a
``torch.compiler.nested_compile_region``: dynamo traces one iteration and the plan's graph calls it
``iterations`` times. ``unrolled`` sets the plain method (``_iteration``) in its place on the planner, which
is the planner without the region: dynamo inlines the ``iterations`` calls and each is traced, fused and
generated anew.

- Compile time: every variant and round runs in its own process with an empty Inductor cache (its own
  ``TORCHINDUCTOR_CACHE_DIR``), the variants alternating within each round. Each reports the wall time of
  the first ``act()`` call (compilation plus one plan), dynamo's split of it and the kernels Inductor
  generated.
- Speed: one more process compiles both variants and times ``act()`` in ``--blocks`` alternating blocks;
  the median milliseconds per call of each and the median of the per-block ratios (``regions`` over
  ``unrolled``).

The module is ``--experiment``'s (default ``tdmpc2_hockey``: the paper's planner, 6 iterations of 512
samples) at ``--size`` (``''``: the experiment's), planning for ``--num-envs`` envs, compiled as the
``TorchCompile`` callback does (``mode="default"``, ``dynamic=False``).

Usage: python benchmarks/tdmpc2_compile.py [--experiment tdmpc2_hockey] [--size 5M] [--num-envs 1]
    [--device cpu] [--rounds 2] [--calls 24] [--blocks 4] [--graphs] [--tag T]
Writes ``benchmarks/results/tdmpc2_compile.json`` (``tdmpc2_compile_T.json`` with ``--tag T``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import write
from tdmpc2_plan_latency import graphed, planning_module, timed  # it puts the repository on sys.path

VARIANTS = ("regions", "unrolled")
#: Dynamo's timers reported per compilation (those this torch version has).
TIMERS = (
    "bytecode_tracing",
    "Scheduler.__init__",
    "Scheduler.codegen",
    "compile_file",
    "async_compile.wait",
    "OutputGraph.call_user_compiler",
)


def own_code(fn, name: str):
    """A function calling ``fn`` whose code object is its own: dynamo keeps its compiled graphs per code
    object, so a second ``torch.compile`` of the same function would find the first one's graph (its
    guards passing) instead of compiling anew."""

    def call(td):
        return fn(td)

    code = call.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, call.__globals__, name, None, call.__closure__)


def with_iteration(planner, variant: str, fn):
    """``fn`` run with the planner's iteration as the nested compile region (``regions``: the planner as it
    is) or as the plain method (``unrolled``: dynamo inlines it, the loop is unrolled), set at each call."""

    def run(*args):
        if variant == "unrolled":
            planner._iterate = planner._iteration
        else:
            planner.__dict__.pop("_iterate", None)
        return fn(*args)

    return run


def compiled(module, variant: str, graphs: bool, device: str):
    """``module.act`` compiled with the iteration as a region or unrolled (:func:`with_iteration`); with
    ``graphs``, captured in a CUDA graph after 3 warm-up calls as the ``CudaGraphs`` callback does."""
    run = with_iteration(
        module.planner,
        variant,
        torch.compile(own_code(module.act, f"act_{variant}"), mode="default", dynamic=False),
    )
    return graphed(run, device) if graphs else run


def worker(args: argparse.Namespace) -> dict:
    """One process: compile the variant(s), then (with both) time them in alternating blocks."""
    from torch._inductor import metrics

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    module, td_fn = planning_module(args.size, args.num_envs, args.device, args.experiment)
    variants = args.worker.split(",")
    acts, out = {}, {"variants": {}}
    for variant in variants:
        torch._dynamo.utils.compilation_time_metrics.clear()
        metrics.reset()
        acts[variant] = compiled(module, variant, args.graphs, args.device)
        first = timed(acts[variant], td_fn(), args.device)
        times = torch._dynamo.utils.compilation_time_metrics
        out["variants"][variant] = {
            "compile_s": round(first, 2),
            "split_s": {k: round(sum(times[k]), 2) for k in TIMERS if k in times},
            "generated_kernels": metrics.generated_kernel_count,
        }
    if len(variants) > 1:
        for fn in acts.values():  # past the first calls (and the capture)
            for _ in range(5):
                timed(fn, td_fn(), args.device)
        per_block = max(1, args.calls // args.blocks)
        block_ms: dict[str, list[float]] = {v: [] for v in variants}
        all_ms: dict[str, list[float]] = {v: [] for v in variants}
        for b in range(args.blocks):
            for v in variants if b % 2 == 0 else variants[::-1]:
                ms = [1e3 * timed(acts[v], td_fn(), args.device) for _ in range(per_block)]
                block_ms[v].append(statistics.median(ms))
                all_ms[v] += ms
        for v in variants:
            out["variants"][v]["ms_median"] = round(statistics.median(all_ms[v]), 2)
        ratios = [a / b for a, b in zip(block_ms["regions"], block_ms["unrolled"], strict=True)]
        out["ms_ratio_regions_to_unrolled"] = round(statistics.median(ratios), 3)
        out["block_ratios"] = [round(r, 3) for r in ratios]
    out["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return out


def spawn(args: argparse.Namespace, variants: str) -> dict:
    """A worker process for ``variants`` with an empty Inductor cache of its own."""
    with tempfile.TemporaryDirectory(prefix="inductor_") as cache:
        cmd = [sys.executable, __file__, "--worker", variants, "--experiment", args.experiment, "--num-envs",
               str(args.num_envs), "--device", args.device, "--threads", str(args.threads), "--calls",
               str(args.calls), "--blocks", str(args.blocks)]  # fmt: skip
        cmd += ["--graphs"] if args.graphs else []
        cmd += ["--size", args.size] if args.size else []
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TRITON_CACHE_DIR": f"{cache}/triton"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"worker {variants} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experiment", default="tdmpc2_hockey")
    parser.add_argument("--size", default="5M", help="algo.model_size ('' for the experiment's)")
    parser.add_argument("--num-envs", type=int, default=1)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument(
        "--rounds", type=int, default=2, help="compile-time processes per variant (0: speed only)"
    )
    parser.add_argument("--calls", type=int, default=24, help="timed act() calls per variant")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--graphs", action="store_true", help="time CUDA-graphed plans (CUDA only)")
    parser.add_argument("--tag", help="result file tdmpc2_compile_TAG.json")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)), flush=True)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here")
    if args.graphs and args.device != "cuda":
        parser.error("--graphs needs --device cuda")
    compile_runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            run = spawn(args, v)["variants"][v]
            compile_runs[v].append(run)
            print(f"round {r + 1}: {v} {json.dumps(run)}", flush=True)
    speed = spawn(args, ",".join(VARIANTS))
    print(f"speed: {json.dumps(speed)}", flush=True)
    summary: dict = {}
    if args.rounds:
        compile_s = {
            v: statistics.median(run["compile_s"] for run in runs) for v, runs in compile_runs.items()
        }
        summary["compile_s_median"] = {v: round(s, 1) for v, s in compile_s.items()}
        summary["compile_ratio_regions_to_unrolled"] = round(compile_s["regions"] / compile_s["unrolled"], 3)
    summary["ms_median"] = {v: speed["variants"][v]["ms_median"] for v in VARIANTS}
    summary["ms_ratio_regions_to_unrolled"] = speed["ms_ratio_regions_to_unrolled"]
    result = {
        "what": "first act() call of the compiled plan (compile + one plan), empty Inductor cache, and ms "
        "per act() call after it; the MPPI iteration as a nested compile region against unrolled",
        "torch_threads": args.threads,
        "settings": {
            "experiment": args.experiment,
            "size": args.size,
            "num_envs": args.num_envs,
            "device": args.device,
            "rounds": args.rounds,
            "calls": args.calls,
            "blocks": args.blocks,
            "cuda_graphs": args.graphs,
        },
        # glibc's allocator settings the processes inherited, if any were set (see the docs)
        "malloc_env": {k: v for k, v in os.environ.items() if k.startswith("MALLOC_")},
        "summary": summary,
        "compile_runs": compile_runs,
        "speed_run": speed,
    }
    print(f"written to {write('tdmpc2_compile' + (f'_{args.tag}' if args.tag else ''), result)}")


if __name__ == "__main__":
    main()
