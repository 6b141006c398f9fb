"""The GPU suite: one command that checks and measures everything that needs CUDA, into one JSON.

    bash benchmarks/gpu_suite.sh [--budgeted] [--out PATH | --out-dir DIR] [--skip-tests] [--cpu]
                                 [--budget S] [--algos A,B] [--variants V,W] [--override KEY=VALUE ...]
                                 [--profile]

``--budgeted`` is the run prepared for a lent GPU machine (15 minutes of device time, its start included):
the steps of ``BUDGETED`` in priority order within 8 minutes (``BUDGETED_S``): ``pytest -m gpu``, the
figures still open (hockey TD-MPC2 with 8 envs per plan; TD-MPC2's plan as ``fast`` runs it against
compile's autotuning, with their kernels), then the rest of the tracked figures. A step
starts only with its minimum time left; what the budget leaves out is reported as not run, not as a
failure. The sections below describe the default order.

Steps, each a subprocess with its own time limit:

1. ``pytest -m gpu``: the tests that need CUDA (every optimization callback's equivalence on the GPU, the
   replay buffer on the device, CUDA graphs and compile of each algorithm's hot paths).
2. ``python -m rl_lightning bench`` for TD-MPC2 (``tdmpc2_hockey``; ``tdmpc2_8envs``: the same with 8 envs
   per plan), SAC (``sac_pendulum``) and DQN (``dqn_cartpole``): first the variants of the tracked figures
   (``TRACKED``), then the rest of each ablation (each optimization alone and the ``fast`` preset against
   none) while the budget lasts, as ratios of env frames/s, updates/s, ``act`` latency and peak GPU memory
   (``bench``'s method: a fresh process per run, a steady-state window after warm-up and compilation).
3. The figures the project tracks, read from those benches: TD-MPC2's plan latency (its ``act``: the
   whole MPPI plan) eager vs compiled vs CUDA-graphed, hockey TD-MPC2 frames/s with ``fast`` (one env, the
   paper's protocol, and 8 envs per plan, one update per env frame either way), SAC's updates/s with
   compile + CUDA graphs against eager, and the peak GPU memory of each.
4. On CUDA, with budget left and TD-MPC2 among ``--algos``: where a frame of hockey TD-MPC2 with ``fast``
   goes, ``benchmarks/fit_parts.py --sync`` from frame 1200 of 2100 (acting, the rest of the collection,
   ``add_frames``, replay samples, updates; each part with its device work). It runs after the tracked
   benches and before the optional ones (the 8-env bench, then the ablation passes); the budget may leave
   it out.

It writes ``benchmarks/results/gpu_suite_<device>.json`` with the device's name and exits 1 if a GPU test
failed, a bench run failed, or a step ran out of time. Without CUDA (or with ``--cpu``) it runs the same
steps on the CPU, sized down (small budgets, the CPU-sized TD-MPC2 experiment, the variants that do
something on a CPU), so the command stays tested where no GPU is lent; the GPU figures then read
``n/a (no CUDA)``.

A GPU is lent for minutes, so the suite fits a lease: ``--budget S`` caps the whole suite (on a GPU 540 s
unless given: each step gets what is left of it; a step with no time left is reported as not run, and only
an ablation pass may be cut short without failing the suite), ``--algos`` and ``--variants`` pick the
benches and their variants (``--variants`` replaces both passes), ``--override`` adds a Hydra override to
each bench, and the JSON is rewritten after every step, and a bench's rows after every variant, so a suite
stopped from outside keeps what it measured. On a GPU the tests run on several workers (pytest-xdist).

``--profile`` runs the TD-MPC2 benches under py-spy (``--nonblocking``: it reads the processes without
stopping them) and puts a summary of each step's samples in the JSON, under ``steps.<bench>.profile``: per
variant process, the functions with the most samples outside compilation and imports, as the innermost frame
and anywhere in the stack. The raw stacks stay in ``runs/gpu_suite/spy_<bench>.txt``; they are too large to
bring back from a lent machine, the summary is not. py-spy is found on ``PATH`` or in ``bin/`` beside an
import path (where ``pip install --target DIR`` puts it): carry its wheel with the others.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from _common import machine, relative_paths

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

#: A replay in host memory (``replay.device=cpu``) feeding a module on the GPU.
HOST = ["replay.device=cpu"]
#: Experiment -> (bench overrides on a GPU, on a CPU), in the order they run. Every run is a process of its
#: own, and the compiled variants compile first. TD-MPC2 on a GPU: 300 random frames and a burst of 300
#: updates (not the experiment's 1255), then 600 frames of one plan and one update each.
BENCHES: dict[str, tuple[list[str], list[str]]] = {
    "tdmpc2": (
        ["+experiment=tdmpc2_hockey", "bench.frames=900", "collect.warmup_frames=300", "bench.act_calls=50"],
        # Compiling TD-MPC2's update and plan takes minutes on a CPU: its CPU part skips compile.
        [
            "+experiment=tdmpc2_hockey_cpu",
            "bench.frames=300",
            "collect.warmup_frames=100",
            "bench.act_calls=5",
            "bench.variants=[fused_optimizer]",
        ],
    ),
    # The same with 8 envs per plan (one batched MPPI plan for 8 envs, still one update per env frame, so
    # the replay ratio is the paper's): 304 random frames, then about 1200 frames: 150 plans, 1200 updates.
    "tdmpc2_8envs": (
        [
            "+experiment=tdmpc2_hockey",
            "env.num_envs=8",
            "bench.frames=1500",
            "collect.warmup_frames=304",
            "bench.act_calls=50",
        ],
        [
            "+experiment=tdmpc2_hockey_cpu",
            "env.num_envs=8",
            "bench.frames=320",
            "collect.warmup_frames=96",
            "bench.act_calls=5",
            "bench.variants=[fused_optimizer]",
        ],
    ),
    "sac": (
        ["+experiment=sac_pendulum", "bench.frames=1500"],
        ["+experiment=sac_pendulum", "bench.frames=400", "algo.hidden_sizes=[64,64]"],
    ),
    "dqn": (
        ["+experiment=dqn_cartpole", "bench.frames=4096"],
        ["+experiment=dqn_cartpole", "bench.frames=2048", "collect.frames_per_batch=128"],
    ),
    # The replay in host memory (replay.device=cpu, for buffers larger than the device's memory), its samples
    # copied to the module on the GPU: blocking (the baseline) against non_blocking (pinned, asynchronous).
    "sac_host_replay": (
        ["+experiment=sac_pendulum", "bench.frames=1500", *HOST],
        ["+experiment=sac_pendulum", "bench.frames=400", "algo.hidden_sizes=[64,64]", *HOST],
    ),
    # DQN from Atari frames (8 envs, the Nature network) with its replay of 1M transitions on the GPU, each
    # frame stored once: peak_mem_mb holds the frame ring's 7.3 GiB, allocated at the start.
    "dqn_atari": (
        ["+experiment=dqn_atari", "bench.frames=8192", "collect.warmup_frames=2048", "bench.act_calls=50"],
        [
            "+experiment=dqn_atari_cpu",
            "bench.frames=600",
            "collect.warmup_frames=200",
            "bench.act_calls=5",
            "bench.variants=[fused_optimizer]",
        ],
    ),
    "dqn_host_replay": (
        ["+experiment=dqn_cartpole", "bench.frames=4096", *HOST],
        ["+experiment=dqn_cartpole", "bench.frames=2048", "collect.frames_per_batch=128", *HOST],
    ),
}
#: The benches of a run without ``--algos`` (``--budgeted``: those of ``BUDGETED``).
DEFAULT_ALGOS = ("tdmpc2", "tdmpc2_8envs", "sac", "dqn")
#: On a GPU, first the variants of the tracked figures (step 3), then the rest of each ablation while
#: ``--budget`` lasts (a bench of its own per algorithm, against its own baseline run), cheapest first.
#: TD-MPC2's ``cuda_graphs`` alone (the plan graphed without compiling) is in its ablation pass.
TRACKED = {"tdmpc2": ["fast"], "tdmpc2_8envs": ["fast"], "sac": ["fast"]}
#: Tracked benches the budget may leave out: on CUDA they run after the others and step 4, before the
#: ablation passes, so a default run of the suite still fits a 10-minute device call.
OPTIONAL_TRACKED = ("tdmpc2_8envs",)
ABLATION_ORDER = ("dqn", "sac", "tdmpc2")
ABLATION = [
    "compile", "cuda_graphs", "fused_optimizer", "direct_steps", "mixed_precision", "tf32", "non_blocking",
    "fast",
]  # fmt: skip
CPU_VARIANTS = ["compile", "fused_optimizer", "direct_steps"]
#: Seconds the whole suite may take on a GPU unless ``--budget`` says otherwise: a 10-minute device call
#: with room for installing the dependencies.
GPU_BUDGET = 540.0
#: The issue's goals for the figures of step 3.
GOALS = {
    "tdmpc2_plan_graphed_speedup": 5.0,
    "tdmpc2_plan_graphed_ms": 1.5,
    "tdmpc2_hockey_fast_env_fps": 300.0,
    "tdmpc2_hockey_fast_env_fps_8_envs": 300.0,
    "sac_fast_updates_speedup": 3.0,
}


#: The plan-latency steps: ``benchmarks/tdmpc2_plan_latency.py`` on TD-MPC2's plan as ``fast`` runs it (5M
#: model, one env, TF32, compiled and CUDA-graphed) against the candidate toward the 1.5 ms goal, compile's
#: ``max-autotune-no-cudagraphs`` (which times Triton kernels against cuBLAS's for each product), each
#: variant's kernels profiled; ``plan_default`` times the eager plan too (the speedup's reference).
_PLAN = ["tdmpc2_plan_latency.py", "--devices", "cuda", "--sizes", "5M", "--precisions", "tf32",
         "--calls", "60", "--warmup", "5", "--kernels"]  # fmt: skip
PLAN_STEPS = {
    "plan_default": [*_PLAN, "--variants", "eager", "compiled_graphs"],
    "plan_autotune": [
        *_PLAN,
        "--variants",
        "compiled_graphs",
        "--compile-mode",
        "max-autotune-no-cudagraphs",
    ],
}
#: ``--budgeted``: the prepared run for a lent GPU, in priority order within ``BUDGETED_S`` (8 minutes of one
#: 10-minute device call; about 2 more go to the machine's start and the wheels). The GPU tests first, then
#: the figures still open, then the rest of the tracked figures; a figure another issue needs on a GPU goes
#: in here, by its priority. The first budgeted run (an H100, ``gpu_suite_nvidia_h100_80gb_hbm3.json``)
#: measured the plan, a side-stream candidate for it and the replay overlap (both settled since:
#: docs/benchmarks.md); the 8-env bench's ``fast`` variant did not finish in the 230 s left after its
#: eager baseline, so it now runs first, without the baseline (its eager figure is
#: known: 20 to 31 frames/s), then compile's autotuning candidate, then SAC and DQN with their replay in host
#: memory, blocking against non-blocking copies of the samples, then DQN from Atari frames with its replay of
#: 1M transitions on the device (frames/s and device memory). A bench step is ``("bench", algo,
#: variants, optional, overrides)``. Each step starts only with its minimum time left (``PLAN_MIN_S``,
#: ``BENCH_MIN_S``, the parts step's 150 s); a step left out is reported as not run, not as a failure.
BUDGETED: tuple[tuple, ...] = (
    ("tests",),
    ("bench", "tdmpc2_8envs", ["fast"], True, ["bench.baseline=false"]),
    ("plan", "plan_autotune"),
    ("bench", "sac_host_replay", ["non_blocking"], True, []),
    ("bench", "dqn_host_replay", ["non_blocking"], True, []),
    ("bench", "dqn_atari", ["fast"], True, []),
    ("plan", "plan_default"),
    ("bench", "tdmpc2", ["fast"], True, ["bench.baseline=false"]),
    ("parts",),
    ("bench", "sac", ["fast"], True, []),
)
BUDGETED_S = 480.0
TEST_TIMEOUT_S = 200  # per GPU test: the slowest compile a test and its eager reference, under load
PLAN_MIN_S = 60.0  # the compiled plan alone compiles in about 30 s on an H200
#: A TD-MPC2 bench's ``fast`` variant compiles for 70 to 90 s on an H200 host and for longer on the H100's
#: (slower cores: the plan alone 43 s against 33 s), after its process starts and its random frames.
BENCH_MIN_S = 200.0

#: The TD-MPC2 benches, whose processes ``--profile`` samples with py-spy; ``PROFILE_TOP``: how many
#: functions a profile's summary lists.
TDMPC2_BENCHES = ("tdmpc2", "tdmpc2_8envs")
PROFILE_TOP = 30
#: py-spy's frame for a sampled process or one of its parents (``--subprocesses``), with its command line.
_PROCESS_FRAME = re.compile(r'process \d+:"(.*?)"(?:;|$)')
#: Stacks with frames of compilation or imports: warm-up, left out of a profile's summary.
_WARMUP_FRAME = re.compile(r"torch/_dynamo/|torch/_inductor/|<frozen importlib|importlib/__init__")


def spy_command(out: Path) -> list[str] | None:
    """The py-spy prefix that samples a command and its subprocesses into ``out`` (raw stacks) without
    stopping them (``--nonblocking``, so the timings stay the processes' own); ``None`` without py-spy.
    Looks on ``PATH`` and in ``bin/`` beside each import path (``pip install --target DIR`` puts it there)."""
    found = shutil.which("py-spy") or next(
        (str(p) for p in (Path(e) / "bin" / "py-spy" for e in sys.path if e) if p.is_file()), None
    )
    if found is None:
        return None
    return [found, "record", "--subprocesses", "--nonblocking", "--rate", "100", "--format", "raw",
            "-o", str(out), "--"]  # fmt: skip


def _frame_name(frame: str) -> str:
    """``function (file:line)`` -> ``function (file)``, the file from its package on (or the project's)."""
    function, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/site/", f"{ROOT}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{function} ({path})"


def _process_name(command: str) -> str:
    """A bench variant's name (from its spec's folder) or the start of the command line."""
    match = re.search(r"variants/([^/\s]+)/spec\d+\.json", command)
    return match.group(1) if match else command[:80] or "(command line not read)"


def spy_summary(raw: Path, top: int = PROFILE_TOP) -> dict[str, Any]:
    """Per process of a py-spy raw profile, most samples first: its samples outside warm-up (stacks with
    compilation or import frames are counted apart) and the functions with the most of them, as the
    innermost frame (``self``) and anywhere in the stack (``total``), as shares of those samples."""
    procs: dict[str, dict[str, Any]] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        # ``process PID:"COMMAND LINE";`` for the process and each of its parents, outermost first (a
        # command line may hold semicolons), then its Python frames, outermost first.
        name, at = "?", 0
        while process := _PROCESS_FRAME.match(stack, at):
            name, at = _process_name(process.group(1)), process.end()
        frames = stack[at:].split(";") if stack[at:] else ["(no Python frame)"]
        proc = procs.setdefault(
            name, {"samples": 0, "warmup_samples": 0, "self": Counter(), "total": Counter()}
        )
        if any(_WARMUP_FRAME.search(f) for f in frames):
            proc["warmup_samples"] += int(count)
            continue
        names = [_frame_name(f) for f in frames]
        proc["samples"] += int(count)
        proc["self"][names[-1]] += int(count)
        for function in set(names):
            proc["total"][function] += int(count)
    summary = {}
    for name, p in sorted(procs.items(), key=lambda kv: -kv[1]["samples"]):
        shares = {
            k: [[f, round(n / max(p["samples"], 1), 4)] for f, n in p[k].most_common(top)]
            for k in ("self", "total")
        }
        summary[name] = {"samples": p["samples"], "warmup_samples": p["warmup_samples"], **shares}
    return summary


def run_step(name: str, cmd: list[str], timeout_s: float, env: dict[str, str], log: Path) -> dict[str, Any]:
    """Runs ``cmd`` from the project root; its status, seconds and the tail of its output (all in ``log``)."""
    print(f"[gpu_suite] {name}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    # A session of its own, so that a step out of time ends with its children (a bench's variant runs).
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        status = f"timed out after {timeout_s:.0f} s"
    log.write_text(output)
    tail = output[-3000:]
    seconds = time.perf_counter() - start
    print(f"[gpu_suite] {name}: {status} in {seconds:.0f} s", flush=True)
    return {"command": " ".join(cmd), "status": status, "seconds": round(seconds, 1), "log": str(log),
            "output_tail": tail}  # fmt: skip


def pytest_counts(tail: str) -> dict[str, int]:
    """``{"passed": n, "failed": n, "skipped": n, ...}`` from pytest's summary line."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", tail)}


def variant_figures(bench: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{variant: {env_fps, updates_per_s, act_ms, peak_mem_mb, status, ...ratios}}`` of a bench JSON."""
    out = {}
    for row in bench.get("variants", []):
        keep = {k: v for k, v in row.items() if k not in ("runs", "callbacks")}
        out[row["variant"]] = keep
    return out


def plan_rows(steps: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of the plan-latency steps that ran."""
    return [row for key in PLAN_STEPS for row in steps.get(key, {}).get("results", [])]


def plan_candidates(plans: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"<variant> <compile mode>": {ms_median, kernels_per_plan, kernel_ms_per_plan, compile_s}}`` of the
    plan-latency steps' rows (the compile mode ``-`` for eager; a row with an error keeps its error)."""
    keep = ("ms_median", "kernels_per_plan", "kernel_ms_per_plan", "compile_s", "error")
    return {
        f"{r['variant']} {r.get('compile_mode') or '-'}": {k: r[k] for k in keep if k in r} for r in plans
    }


def tracked_figures(
    benches: dict[str, dict[str, Any]], cuda: bool, plans: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The figures of step 3, with their goals, from the benches' variants; ``plans``: the rows of the
    plan-latency steps, which give the plan's figures where the one-env bench did not run."""
    na = "n/a (no CUDA)" if not cuda else "not measured"
    figures: dict[str, Any] = {}
    tdmpc2 = variant_figures(benches.get("tdmpc2", {}))
    sac = variant_figures(benches.get("sac", {}))
    candidates = plan_candidates(plans or [])
    if candidates:
        figures["tdmpc2_plan_candidates"] = candidates
        # The planner as it is, timed alone: the figure when the bench has none.
        for variant, key in (("baseline", "eager -"), ("fast", "compiled_graphs default")):
            if "ms_median" in candidates.get(key, {}) and tdmpc2.get(variant, {}).get("act_ms") is None:
                tdmpc2.setdefault(variant, {})["act_ms"] = candidates[key]["ms_median"]
                figures.setdefault("tdmpc2_plan_from_latency_benchmark", []).append(variant)

    def get(rows: dict, variant: str, key: str) -> float | None:
        value = rows.get(variant, {}).get(key)
        return float(value) if isinstance(value, int | float) else None

    eager = get(tdmpc2, "baseline", "act_ms")
    figures["tdmpc2_plan_ms"] = {
        "eager": eager,
        "compiled": get(tdmpc2, "compile", "act_ms") if cuda else na,
        "cuda_graphed": get(tdmpc2, "cuda_graphs", "act_ms") if cuda else na,
        "compiled_and_graphed": get(tdmpc2, "fast", "act_ms") if cuda else na,
    }
    cuda_graphed = get(tdmpc2, "cuda_graphs", "act_ms") if cuda else None
    figures["tdmpc2_plan_cuda_graphs_speedup"] = eager / cuda_graphed if eager and cuda_graphed else na
    graphed = get(tdmpc2, "fast", "act_ms") if cuda else None
    figures["tdmpc2_plan_graphed_speedup"] = eager / graphed if eager and graphed else na
    figures["tdmpc2_plan_graphed_ms"] = graphed if graphed else na
    fps = get(tdmpc2, "fast", "env_fps") if cuda else None
    figures["tdmpc2_hockey_fast_env_fps"] = fps if fps else na
    eight = variant_figures(benches.get("tdmpc2_8envs", {}))
    fps = get(eight, "fast", "env_fps") if cuda else None
    figures["tdmpc2_hockey_fast_env_fps_8_envs"] = fps if fps else na
    figures["tdmpc2_plan_ms_8_envs"] = {
        "eager": get(eight, "baseline", "act_ms"),
        "compiled_and_graphed": get(eight, "fast", "act_ms") if cuda else na,
    }
    base_ups, fast_ups = get(sac, "baseline", "updates_per_s"), get(sac, "fast", "updates_per_s")
    figures["sac_fast_updates_speedup"] = fast_ups / base_ups if cuda and base_ups and fast_ups else na
    figures["peak_mem_mb"] = {
        algo: {variant: row.get("peak_mem_mb") for variant, row in variant_figures(b).items()}
        for algo, b in benches.items()
    }
    figures["goals"] = GOALS
    figures["goals_met"] = {
        key: (figures[key] <= goal if key.endswith("_ms") else figures[key] >= goal)
        if isinstance(figures[key], float)
        else None
        for key, goal in GOALS.items()
    }
    return figures


#: Step 4: a short hockey TD-MPC2 fit with ``fast``, its parts timed from frame 1200 on (after compiling).
PARTS_ARGS = [
    "+experiment=tdmpc2_hockey", "callbacks=fast", "device=cuda", "logger=none", "total_frames=2100",
    "collect.warmup_frames=300", "eval.episodes=1", "eval.variants={}", "--sync", "--from-frames", "1200",
]  # fmt: skip


def script_step(
    steps: dict[str, Any],
    key: str,
    args: list[str],
    workdir: Path,
    env: dict[str, str],
    limit: float,
    failed: list,
    min_s: float,
    optional: bool = False,
) -> None:
    """Runs ``benchmarks/<args[0]>`` with the rest of ``args`` and ``--out``, and keeps the ``results`` of the
    JSON it writes under ``steps[key]``; with less than ``min_s`` seconds left it is reported as not run.

    A run stopped by its time limit keeps the rows it printed (lines of JSON objects, as the plan-latency
    benchmark prints each row when measured); an ``optional`` step so stopped is no failure."""
    out = workdir / f"{key}.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / args[0]), *args[1:], "--out", str(out)]
    if limit < min_s:
        steps[key] = {"command": " ".join(cmd), "status": "not run: --budget spent"}
        return
    out.unlink(missing_ok=True)
    log = workdir / f"{key}.log"
    step = run_step(key, cmd, limit, env, log)
    if out.exists():
        step["results"] = json.loads(out.read_text())["results"]
    elif step["status"] == "ok":
        step["status"] = "failed: no results"
    else:
        step["results"] = printed_rows(log.read_text())
    if optional and step["status"].startswith("timed out"):
        step["status"] = f"stopped by --budget ({step['status']})"
    elif step["status"] != "ok":
        failed.append(f"{key}: {step['status']}")
    steps[key] = step


def printed_rows(output: str) -> list[dict[str, Any]]:
    """The lines of ``output`` that are JSON objects: the rows a benchmark printed as it measured them."""
    rows = []
    for line in output.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return [r for r in rows if isinstance(r, dict)]


def parts_step(steps: dict[str, Any], workdir: Path, env: dict[str, str], limit: float, failed: list) -> None:
    """Step 4: ``fit_parts.py --sync`` of hockey TD-MPC2 with ``fast``: ms per frame of each part."""
    cmd = [sys.executable, str(ROOT / "benchmarks" / "fit_parts.py"), *PARTS_ARGS, "--out", str(workdir)]
    if limit < 150:  # compiling alone takes about two minutes on an H200
        steps["tdmpc2_parts"] = {"command": " ".join(cmd), "status": "not run: --budget spent"}
        return
    result = RESULTS / "fit_parts_tdmpc2_hockey.json"
    result.unlink(missing_ok=True)
    step = run_step("tdmpc2 parts", cmd, limit, env, workdir / "tdmpc2_parts.log")
    if result.exists():
        parts = json.loads(result.read_text())["parts"]
        step["ms_per_frame"] = {
            k: round(v["us_per_frame"] / 1e3, 3) for k, v in parts.items() if "us_per_frame" in v
        }
    elif step["status"] == "ok":
        step["status"] = "failed: no results"
    if step["status"].startswith("failed"):  # out of time is the budget's doing: the step is optional
        failed.append(f"tdmpc2 parts: {step['status']}")
    steps["tdmpc2_parts"] = step


def bench_plan(algos: list[str], variants: list[str] | None, cuda: bool) -> list[tuple[str, list[str], bool]]:
    """``(algo, variants, optional)`` in the order the benches run; the budget may stop an optional one.

    ``variants`` given: those, one bench per algorithm. On CUDA: the ``TRACKED`` variants, then (optional)
    those of ``OPTIONAL_TRACKED`` and the rest of ``ABLATION`` in ``ABLATION_ORDER``. On a CPU:
    ``CPU_VARIANTS``.
    """
    if variants:
        return [(a, variants, False) for a in algos]
    if cuda:
        plan = [(a, TRACKED[a], False) for a in algos if a in TRACKED and a not in OPTIONAL_TRACKED]
        plan += [(a, TRACKED[a], True) for a in algos if a in OPTIONAL_TRACKED]
        rest = [a for a in ABLATION_ORDER if a in algos]
        return plan + [(a, [v for v in ABLATION if v not in TRACKED.get(a, [])], True) for a in rest]
    return [(a, CPU_VARIANTS, False) for a in algos]


def merge_rows(benches: dict[str, dict[str, Any]], algo: str, result: dict[str, Any]) -> None:
    """Adds a bench's results to ``benches[algo]``; rows of variants it already has (the tracked bench's,
    which runs first, and its baseline) stay, so the figures read each variant from one bench."""
    if algo not in benches:
        benches[algo] = result
        return
    have = {row["variant"] for row in benches[algo]["variants"]}
    benches[algo]["variants"] += [row for row in result["variants"] if row["variant"] not in have]


def bench_verdict(
    status: str, rows: dict[str, dict[str, Any]], optional: bool, budget_spent: bool
) -> tuple[str, list[str]]:
    """A bench step's status and its variants that failed.

    An optional bench that the budget stopped has measured what it could: its status reads ``stopped by
    --budget`` and its variants not run yet are no failure. A run that failed or hit ``bench.timeout_s`` is
    one, in any bench.
    """
    stopped = optional and budget_spent and status.startswith("timed out")
    not_ok = ("fail", "timed") if stopped else ("fail", "timed", "not run")
    bad = [v for v, row in rows.items() if str(row.get("status", "ok")).startswith(not_ok)]
    return ("stopped by --budget" if stopped else status), bad


def schedule(
    algos: list[str], variants: list[str] | None, cuda: bool, skip_tests: bool, budgeted: bool
) -> list[tuple]:
    """The suite's steps in the order they run: ``("tests",)``, ``("plan", name)``,
    ``("bench", algo, variants, optional[, overrides])`` and ``("parts",)``.

    Budgeted (``--budgeted``): ``BUDGETED`` in its priority order, its benches limited to ``algos``.
    Otherwise the tests, then ``bench_plan``'s benches with the parts step before the first optional one
    (or last) when ``tdmpc2`` is among them on CUDA.
    """
    if budgeted:
        return [
            step for step in BUDGETED
            if not (step[0] == "tests" and skip_tests) and not (step[0] == "bench" and step[1] not in algos)
        ]  # fmt: skip
    steps: list[tuple] = [] if skip_tests else [("tests",)]
    parts_due = cuda and "tdmpc2" in algos
    for algo, names, optional in bench_plan(algos, variants, cuda):
        if optional and parts_due:
            steps.append(("parts",))
            parts_due = False
        steps.append(("bench", algo, names, optional))
    return steps + ([("parts",)] if parts_due else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="the JSON to write")
    parser.add_argument(
        "--out-dir", type=Path, default=None, help="write the JSON into this folder (its usual name)"
    )
    parser.add_argument("--cpu", action="store_true", help="run the CPU-sized suite even with CUDA")
    parser.add_argument(
        "--budgeted",
        action="store_true",
        help=f"the prepared run for a lent GPU: BUDGETED's steps by priority within --budget "
        f"({BUDGETED_S:.0f} s unless given)",
    )
    parser.add_argument("--skip-tests", action="store_true", help="skip pytest -m gpu")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample the TD-MPC2 benches with py-spy (a summary per process)",
    )
    parser.add_argument("--timeout", type=int, default=240, help="seconds per step")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole suite")
    parser.add_argument("--algos", default=None, help="benches to run (comma list; default: DEFAULT_ALGOS)")
    parser.add_argument("--variants", default=None, help="bench variants (comma list) instead of the default")
    parser.add_argument(
        "--override", action="append", default=[], help="a Hydra override for every bench (repeatable)"
    )
    args = parser.parse_args()
    algos = [a for a in args.algos.split(",") if a] if args.algos else list(DEFAULT_ALGOS)
    if args.budgeted and not args.algos:
        algos = list(BENCHES)
    unknown = sorted(set(algos) - set(BENCHES))
    if unknown:
        parser.exit(2, f"gpu_suite: unknown --algos {unknown}; choose from {sorted(BENCHES)}.\n")

    cuda = torch.cuda.is_available() and not args.cpu
    if args.budgeted and (not cuda or args.variants):
        parser.exit(2, "gpu_suite: --budgeted is the prepared run for a GPU, with its own variants; without "
                       "CUDA, or to choose variants, run the suite without --budgeted.\n")  # fmt: skip
    device = "cuda" if cuda else "cpu"
    device_name = torch.cuda.get_device_name(0) if cuda else "cpu (no CUDA)"
    slug = re.sub(r"[^a-z0-9]+", "_", device_name.lower()).strip("_") if cuda else "cpu"
    out = args.out or (args.out_dir or RESULTS) / f"gpu_suite_{slug}.json"
    default_budget = BUDGETED_S if args.budgeted else GPU_BUDGET if cuda else None
    budget = args.budget if args.budget is not None else default_budget
    variants = args.variants.split(",") if args.variants else None
    workdir = ROOT / "runs" / "gpu_suite"
    workdir.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    suite_start = time.perf_counter()

    def left(limit: float) -> float:
        """A step's time limit: its own, or what is left of ``--budget``."""
        if budget is None:
            return limit
        return min(limit, budget - (time.perf_counter() - suite_start))

    steps: dict[str, Any] = {}
    failed: list[str] = []
    benches: dict[str, dict[str, Any]] = {}

    def write() -> None:
        """The JSON as it stands: rewritten after every step."""
        result = {
            "benchmark": "gpu_suite",
            "command": "bash benchmarks/gpu_suite.sh " + " ".join(sys.argv[1:]),
            "device": device,
            "device_name": device_name,
            "cuda": cuda,
            "torch": torch.__version__,
            "machine": machine(),
            "budget_s": budget,
            "seconds": round(time.perf_counter() - suite_start, 1),
            "figures": tracked_figures(benches, cuda, plan_rows(steps)),
            "failed": failed,
            "steps": steps,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(relative_paths(result), indent=2) + "\n")

    def tests_step() -> None:
        pytest = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
        if cuda and importlib.util.find_spec("xdist") is not None:
            # Compiling is most of these tests' time, and it runs on the host's cores.
            pytest += ["-n", str(max(1, min(8, (os.cpu_count() or 2) // 2)))]
        if importlib.util.find_spec("pytest_timeout") is not None:
            pytest += ["--timeout", str(TEST_TIMEOUT_S)]  # one hung test must not take the step's time
        if left(args.timeout * 2) > 0:
            step = run_step("pytest -m gpu", pytest, left(args.timeout * 2), env, workdir / "pytest_gpu.log")
            step["counts"] = pytest_counts(step["output_tail"])
        else:
            step = {"command": " ".join(pytest), "status": "not run: --budget spent", "counts": {}}
        # Without CUDA every test is skipped (pytest exits 5 when it selects none, 0 when all skip).
        if cuda and (step["status"] != "ok" or step["counts"].get("failed") or step["counts"].get("errors")):
            failed.append("pytest -m gpu")
        steps["pytest_gpu"] = step

    def bench_step(algo: str, names: list[str], optional: bool, overrides: list[str] = ()) -> None:
        gpu_args, cpu_args = BENCHES[algo]
        tag = f"{algo}_ablation" if optional and not args.budgeted else algo
        bench_out = workdir / f"bench_{tag}_{device}.json"
        bench_out.unlink(missing_ok=True)
        cmd = [
            sys.executable, "-m", "rl_lightning", "bench", f"bench.variants=[{','.join(names)}]",
            *(gpu_args if cuda else cpu_args), f"device={device}", "logger=none", "progress_bar=false",
            "bench.repeats=1", f"bench.out={bench_out}", f"bench.timeout_s={max(1, int(left(args.timeout)))}",
            f"run_dir={workdir / tag}", *overrides, *args.override,
        ]  # fmt: skip
        if left(args.timeout * 9) < (BENCH_MIN_S if args.budgeted else 1):
            steps[f"bench_{tag}"] = {"command": " ".join(cmd), "status": "not run: --budget spent"}
            if not optional:
                failed.append(f"bench {tag}: not run within --budget")
            return
        profiled = args.profile and algo in TDMPC2_BENCHES
        spy_raw = workdir / f"spy_{tag}.txt"
        spy_raw.unlink(missing_ok=True)
        spy = spy_command(spy_raw) if profiled else None
        log = workdir / f"bench_{tag}.log"
        step = run_step(f"bench {tag}", (spy or []) + cmd, left(args.timeout * 9), env, log)
        if profiled:
            found = spy_raw.exists() and spy_raw.stat().st_size
            step["profile"] = (
                spy_summary(spy_raw)
                if found
                else "not recorded: " + ("no py-spy found" if spy is None else "py-spy wrote nothing")
            )
        if bench_out.exists():
            result = json.loads(bench_out.read_text())
            merge_rows(benches, algo, result)
            step["complete"] = result.get("complete", True)
            step["variants"] = variant_figures(result)
            step["status"], bad = bench_verdict(step["status"], step["variants"], optional, left(1) <= 1)
            if bad or step["status"] not in ("ok", "stopped by --budget"):
                failed.append(f"bench {tag}: {', '.join(bad) or step['status']}")
        else:
            failed.append(f"bench {tag}: {step['status']}, no results")
        steps[f"bench_{tag}"] = step

    for kind, *rest in schedule(algos, variants, cuda, args.skip_tests, args.budgeted):
        if kind == "tests":
            tests_step()
        elif kind == "plan":
            name = rest[0]
            limit = left(args.timeout)
            script_step(steps, name, PLAN_STEPS[name], workdir, env, limit, failed, PLAN_MIN_S, args.budgeted)
        elif kind == "parts":
            parts_step(steps, workdir, env, left(args.timeout), failed)
        else:
            bench_step(*rest)
        write()

    write()
    figures = tracked_figures(
        benches, cuda, [r for k in PLAN_STEPS for r in steps.get(k, {}).get("results", [])]
    )
    print(json.dumps(figures, indent=2))
    print(f"[gpu_suite] {out} ({time.perf_counter() - suite_start:.0f} s)")
    if failed:
        print("[gpu_suite] FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
