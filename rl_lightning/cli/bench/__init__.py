"""``python -m rl_lightning bench +experiment=NAME``: the speed of each optimization callback, as ratios.

Variants: ``baseline`` (no callback at all, not even the default monitors; ``bench.baseline=false`` leaves it
out, and the ratios with it), then every name in ``bench.variants`` (a ``conf/callbacks/`` option, alone, or a
preset such as ``fast``). A callback that only acts on CUDA (``GPU_ONLY``) is reported as ``n/a (no CUDA)`` on
a CPU instead of run. A variant's callback config comes from its ``conf/callbacks/`` file, or from the command
line's ``callbacks.<name>`` node when the command selected that callback (``callbacks=[default,compile]
callbacks.compile.mode=...``).

Method, and why:

- Every run is a fresh ``python`` process that rebuilds the experiment from the resolved config: compile
  caches, dynamo's recompile counters, TF32 and autocast state, CUDA-graph pools and allocator peaks never
  leak from one variant into the next, and a crash or hang (``bench.timeout_s``) costs one row, not the
  bench. Startup and imports are outside the figures.
- Each run is a real ``fit`` of ``bench.frames`` frames with the training callbacks of a normal run except
  evaluation and checkpointing, whose time is not the training loop's.
- Steady state: the figures cover a window that opens at the first collection boundary after the random
  warm-up frames, the TD-MPC2 seeding burst and one collection with the policy (so ``update`` and ``act``
  have compiled, been captured, and allocated their state), and closes when the budget is spent.
  ``env_fps`` and ``updates_per_s`` are the window's frame and update counts over its wall-clock time, with
  the device synchronized only at its two ends. ``warmup_s`` is the time before the window.
- ``act_ms``: after the fit, ``act`` (the acting policy; TD-MPC2's whole MPPI plan) is called on fixed
  observations of the training envs' shape under ``torch.no_grad()`` as the collector does, outside the
  collector: 5 untimed calls, then ``bench.act_calls`` timed ones between two synchronizations.
- ``peak_mem_mb``: on CUDA ``torch.cuda.max_memory_allocated`` over the run; on a CPU the growth of the
  process's peak resident memory (Linux: its own ``VmHWM``; elsewhere ``ru_maxrss``) from after the imports
  to the end of the run.
  Both include compilation.
- ``bench.repeats`` rounds: each round runs every variant once, in order, so that a spell of load from
  other processes hits all variants rather than one. Each figure is the best over the rounds (highest
  rate, lowest latency and memory), which load lowers least; ``baseline_spread`` (the baseline's
  frames/s range over the rounds, relative to its best) says how far apart repeated runs of the same code
  land on this machine: ratios within it are noise. Ratios are variant / baseline: above 1 is better for
  the rates, worse for latency and memory.
- Threads and float mode: the variant processes use the root ``torch_threads`` and ``flush_denormal``
  settings, like every command; the results record both.

Results: a table on the console, ``<run_dir>/bench_results.json`` (and ``bench.out``), and one MLflow run
(``<name>-bench``) with ``bench/<variant>/<figure>`` and ``.../<figure>_ratio`` metrics. The JSON is
rewritten after every run, ``"complete": false`` and the variants not run yet saying so until the last, so a
bench stopped from outside (a time limit) keeps the rows it measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rl_lightning.cli.bench.report import FIGURES, add_ratios, best_of_rounds, log_mlflow, print_table
from rl_lightning.cli.bench.variants import (
    GPU_ONLY,
    callbacks_node,
    check_frames,
    check_variants,
    run_once,
)
from rl_lightning.cli.doctor import machine_info
from rl_lightning.device import resolve_device

__all__ = ["FIGURES", "GPU_ONLY", "bench"]


def bench(cfg: DictConfig) -> dict[str, Any]:
    """Runs the variants (see the module docstring), prints, saves and logs the table; returns the results."""
    variants = check_variants(list(cfg.bench.variants))
    check_frames(cfg, int(cfg.bench.frames))
    if int(cfg.bench.repeats) < 1 or int(cfg.bench.act_calls) < 1:
        raise ValueError("bench.repeats and bench.act_calls must be >= 1.")
    device = resolve_device(cfg.device)
    run_dir = Path(cfg.run_dir).resolve()
    # bench.baseline=false skips the reference run where only a variant's own figures are wanted (a lent
    # GPU's minutes); the rows then carry no ratios.
    names = ["baseline", *variants] if cfg.bench.get("baseline", True) else variants
    skipped = {v for v in names if device.type != "cuda" and v in GPU_ONLY}
    nodes = {v: callbacks_node(cfg, None if v == "baseline" else v) for v in names if v not in skipped}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in nodes}
    repeats = int(cfg.bench.repeats)
    # What every write of the results holds; machine_info reads the machine once.
    header = {
        "experiment": cfg.name,
        "frames": int(cfg.bench.frames),
        "device": str(device),
        "seed": int(cfg.seed),
        "repeats": repeats,
        "torch_threads": cfg.get("torch_threads"),
        "flush_denormal": cfg.get("flush_denormal"),
        "method": "rl_lightning.cli.bench: a process per variant, steady-state window, best of rounds",
        "machine": machine_info(),
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = [run_dir / "bench_results.json"]
    if cfg.bench.out:
        paths.append(Path(cfg.bench.out).resolve())
    for i in range(repeats):
        for variant, callbacks in nodes.items():
            print(f"bench {cfg.name}: {variant} (round {i + 1}/{repeats})", flush=True)
            runs[variant].append(run_once(cfg, callbacks, run_dir / "variants" / variant, i))
            status = runs[variant][-1]["status"]
            if variant == "baseline" and status != "ok":
                raise RuntimeError(f"bench: the baseline run failed, nothing to compare with: {status}")
            # The rows so far, after every run: a bench stopped from outside keeps what it measured.
            _write(_results(header, names, skipped, nodes, runs, complete=False), paths)
    results = _results(header, names, skipped, nodes, runs, complete=True)
    _write(results, paths)
    print_table(results)
    print(f"results: {', '.join(str(p) for p in paths)}")
    log_mlflow(cfg, results, run_dir, paths[0])
    return results


def _results(
    header: dict[str, Any],
    names: list[str],
    skipped: set[str],
    nodes: dict[str, dict[str, Any]],
    runs: dict[str, list[dict[str, Any]]],
    complete: bool,
) -> dict[str, Any]:
    """The results JSON; ``complete`` is false while rounds remain (a variant not run yet says so)."""
    rows: list[dict[str, Any]] = []
    for variant in names:
        if variant in skipped:
            rows.append({"variant": variant, "status": "n/a (no CUDA)"})
        elif not runs[variant]:
            rows.append({"variant": variant, "status": "not run yet"})
        else:
            rows.append(
                {"variant": variant, "callbacks": sorted(nodes[variant]), **best_of_rounds(runs[variant])}
            )
    if "baseline" in runs:
        add_ratios(rows)
    base_fps = [r["env_fps"] for r in runs.get("baseline", []) if r.get("env_fps") is not None]
    spread = (max(base_fps) - min(base_fps)) / max(base_fps) if len(base_fps) > 1 else None
    return {**header, "complete": complete, "baseline_spread": spread, "variants": rows}


def _write(results: dict[str, Any], paths: list[Path]) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
