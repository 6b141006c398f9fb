"""``python -m rl_lightning bench +experiment=NAME``: the speed of each optimization callback, as ratios.

Variants: ``baseline`` (no callback at all, not even the default monitors), then every name in
``bench.variants`` (a ``conf/callbacks/`` option, alone, or a preset such as ``fast``). A callback that only
acts on CUDA (``GPU_ONLY``) is reported as ``n/a (no CUDA)`` on a CPU instead of run. A variant's callback
config comes from its ``conf/callbacks/`` file, or from the command line's ``callbacks.<name>`` node when
the command selected that callback (``callbacks=[default,compile] callbacks.compile.mode=...``).

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
  process's peak resident memory (``ru_maxrss``) from after the imports to the end of the run.
  Both include compilation.
- ``bench.repeats`` rounds: each round runs every variant once, in order, so that a spell of load from
  other processes hits all variants rather than one. Each figure is the best over the rounds (highest
  rate, lowest latency and memory), which load lowers least; ``baseline_spread`` (the baseline's
  frames/s range over the rounds, relative to its best) says how far apart repeated runs of the same code
  land on this machine: ratios within it are noise. Ratios are variant / baseline: above 1 is better for
  the rates, worse for latency and memory.
- Threads: the variant processes use the root ``torch_threads`` setting, like every command.

Results: a table on the console, ``<run_dir>/bench_results.json`` (and ``bench.out``), and one MLflow run
(``<name>-bench``) with ``bench/<variant>/<figure>`` and ``.../<figure>_ratio`` metrics.
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli import CONF_DIR, compose
from rl_lightning.data.replay import resolve_device
from rl_lightning.doctor import machine_info

__all__ = ["FIGURES", "GPU_ONLY", "bench", "worker_main"]

#: Callbacks that do nothing without CUDA (each says "CPU: no-op" in its config file).
GPU_ONLY = frozenset({"non_blocking", "tf32", "cuda_graphs", "gpu_monitor", "cuda_cache"})
#: Figure -> True when higher is better.
FIGURES = {"env_fps": True, "updates_per_s": True, "act_ms": False, "peak_mem_mb": False}
_ACT_WARMUP = 5
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Failed|Interrupt)\b")


# ---------------------------------------------------------------------------------------------- parent
def _check_variants(names: list[str]) -> list[str]:
    known = sorted(p.stem for p in (CONF_DIR / "callbacks").glob("*.yaml"))
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"bench.variants={names}: {'unknown ' + str(unknown) if unknown else 'duplicates'}; "
            f"choose among {known}."
        )
    return names


def _steady_start(cfg: DictConfig) -> int:
    """Frame count after which the steady-state window may open (warm-up plus one policy collection)."""
    fpb = int(cfg.collect.frames_per_batch)
    return math.ceil(int(cfg.collect.warmup_frames) / fpb) * fpb + fpb


def _check_frames(cfg: DictConfig, frames: int) -> None:
    fpb = int(cfg.collect.frames_per_batch)
    need = _steady_start(cfg) + 2 * fpb
    if frames < need:
        raise ValueError(
            f"bench.frames={frames} leaves less than two collections of steady state after the warm-up "
            f"(collect.warmup_frames={cfg.collect.warmup_frames}, frames_per_batch={fpb}); use "
            f"bench.frames>={need} or lower collect.warmup_frames."
        )


def _callbacks_node(cfg: DictConfig, name: str | None) -> dict[str, Any]:
    """The ``callbacks`` node of a variant: its option composed alone, the user's settings preferred."""
    if name is None:
        return {}
    composed = OmegaConf.to_container(compose([f"callbacks=[{name}]"]).callbacks, resolve=True)
    mine = OmegaConf.to_container(cfg.callbacks, resolve=True) if cfg.callbacks else {}
    return {key: mine.get(key) or node for key, node in composed.items()}


def _variant_config(cfg: DictConfig, callbacks: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    out = OmegaConf.to_container(cfg, resolve=True)
    out.update(
        total_frames=int(cfg.bench.frames),
        callbacks=callbacks,
        logger=None,
        progress_bar=False,
        ckpt_path=None,
        run_dir=str(run_dir),
    )
    return out


def _run_once(cfg: DictConfig, callbacks: dict[str, Any], run_dir: Path, index: int) -> dict:
    """One variant process: writes its spec and config into ``run_dir``, returns its figures or status."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "config": _variant_config(cfg, callbacks, run_dir),
        "steady_start": _steady_start(cfg),
        "act_calls": int(cfg.bench.act_calls),
        "out": str(run_dir / f"result{index}.json"),
    }
    spec_path = run_dir / f"spec{index}.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log = run_dir / f"run{index}.log"
    code = "from rl_lightning.bench import worker_main; worker_main()"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    start = time.perf_counter()
    try:
        with log.open("w") as fh:
            proc = subprocess.run(
                [sys.executable, "-c", code, str(spec_path)],
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=float(cfg.bench.timeout_s),
                env=env,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return {"status": f"failed: timed out after bench.timeout_s={cfg.bench.timeout_s} s (see {log})"}
    wall = time.perf_counter() - start
    if proc.returncode != 0 or not Path(spec["out"]).is_file():
        lines = [ln for ln in log.read_text().splitlines() if ln.strip()]
        errors = [ln for ln in lines if _ERROR_LINE.match(ln)]
        reason = (errors or lines or ["?"])[-1][:300]
        return {"status": f"failed (exit {proc.returncode}): {reason} (see {log})"}
    result = json.loads(Path(spec["out"]).read_text())
    result["process_s"] = round(wall, 2)
    return result


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return {"status": runs[-1]["status"], "runs": runs}
    out: dict[str, Any] = {"status": "ok", "runs": runs}
    for key, higher in FIGURES.items():
        values = [r[key] for r in ok if r.get(key) is not None]
        out[key] = (max if higher else min)(values) if values else None
    out["warmup_s"] = min(r["warmup_s"] for r in ok)
    out["memory"] = ok[0]["memory"]
    return out


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    base = rows[0]
    for row in rows:
        if row.get("status") != "ok":
            continue
        row["ratios"] = {
            key: (row[key] / base[key] if row.get(key) and base.get(key) else None) for key in FIGURES
        }


def bench(cfg: DictConfig) -> dict[str, Any]:
    """Runs the variants (see the module docstring), prints, saves and logs the table; returns the results."""
    variants = _check_variants(list(cfg.bench.variants))
    _check_frames(cfg, int(cfg.bench.frames))
    if int(cfg.bench.repeats) < 1 or int(cfg.bench.act_calls) < 1:
        raise ValueError("bench.repeats and bench.act_calls must be >= 1.")
    device = resolve_device(cfg.device)
    run_dir = Path(cfg.run_dir).resolve()
    names = ["baseline", *variants]
    skipped = {v for v in names if device.type != "cuda" and v in GPU_ONLY}
    nodes = {v: _callbacks_node(cfg, None if v == "baseline" else v) for v in names if v not in skipped}
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in nodes}
    repeats = int(cfg.bench.repeats)
    for i in range(repeats):
        for variant, callbacks in nodes.items():
            print(f"bench {cfg.name}: {variant} (round {i + 1}/{repeats})", flush=True)
            runs[variant].append(_run_once(cfg, callbacks, run_dir / "variants" / variant, i))
            status = runs[variant][-1]["status"]
            if variant == "baseline" and status != "ok":
                raise RuntimeError(f"bench: the baseline run failed, nothing to compare with: {status}")
    rows: list[dict[str, Any]] = []
    for variant in names:
        if variant in skipped:
            rows.append({"variant": variant, "status": "n/a (no CUDA)"})
        else:
            rows.append({"variant": variant, "callbacks": sorted(nodes[variant]), **_best(runs[variant])})
    _add_ratios(rows)
    base_fps = [r["env_fps"] for r in runs["baseline"]]
    results = {
        "experiment": cfg.name,
        "frames": int(cfg.bench.frames),
        "device": str(device),
        "seed": int(cfg.seed),
        "repeats": repeats,
        "torch_threads": cfg.get("torch_threads"),
        "baseline_spread": (max(base_fps) - min(base_fps)) / max(base_fps) if repeats > 1 else None,
        "method": "rl_lightning/bench.py: a process per run, steady-state window, best of interleaved rounds",
        "machine": machine_info(),
        "variants": rows,
    }
    run_dir.mkdir(parents=True, exist_ok=True)
    paths = [run_dir / "bench_results.json"]
    if cfg.bench.out:
        paths.append(Path(cfg.bench.out).resolve())
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2) + "\n")
    print_table(results)
    print(f"results: {', '.join(str(p) for p in paths)}")
    _log_mlflow(cfg, results, run_dir, paths[0])
    return results


def _fmt(value: float | None, ratio: float | None) -> str:
    if value is None:
        return "-"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
    text = f"{value:,.{digits}f}"
    return f"{text} ({ratio:.2f}x)" if ratio is not None else text


def _short(status: str, width: int = 50) -> str:
    text = status.split(" (see ")[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def print_table(results: dict[str, Any]) -> None:
    """The results as a rich table: figures with their ratio to the baseline."""
    from rich.console import Console
    from rich.table import Table

    mem = next((r.get("memory") for r in results["variants"] if r.get("memory")), "memory")
    spread = results["baseline_spread"]
    table = Table(
        title=f"bench {results['experiment']} on {results['device']}, {results['frames']} frames "
        f"(x baseline; best of {results['repeats']})",
        caption=f"baseline frames/s spread over the rounds: {spread:.0%}" if spread is not None else None,
    )
    for header in ("variant", "env frames/s", "updates/s", "act ms", f"peak MB ({mem})", "warm-up s"):
        table.add_column(header, justify="left" if header == "variant" else "right")
    for row in results["variants"]:
        if row["status"] != "ok":
            # The whole message, with the log's path, is in the JSON.
            table.add_row(row["variant"], _short(row["status"]), "", "", "", "")
            continue
        r = row["ratios"]
        table.add_row(
            row["variant"],
            _fmt(row["env_fps"], r["env_fps"]),
            _fmt(row["updates_per_s"], r["updates_per_s"]),
            _fmt(row["act_ms"], r["act_ms"]),
            _fmt(row["peak_mem_mb"], r["peak_mem_mb"]),
            f"{row['warmup_s']:.1f}",
        )
    Console(width=160).print(table)


def _log_mlflow(cfg: DictConfig, results: dict[str, Any], run_dir: Path, json_path: Path) -> None:
    if not cfg.logger:
        return
    from rl_lightning.commands import _make_logger

    logger = _make_logger(OmegaConf.merge(cfg, {"logger": {"run_name": f"{cfg.name}-bench"}}), run_dir)
    logger.log_hyperparams(
        {
            "experiment": cfg.name,
            "frames": results["frames"],
            "device": results["device"],
            "variants": ",".join(r["variant"] for r in results["variants"]),
            "repeats": results["repeats"],
            "torch_threads": str(results["torch_threads"]),
        }
    )
    metrics: dict[str, float] = {}
    for row in results["variants"]:
        if row["status"] != "ok":
            continue
        for key in (*FIGURES, "warmup_s"):
            if row.get(key) is not None:
                metrics[f"bench/{row['variant']}/{key}"] = float(row[key])
        for key, ratio in row["ratios"].items():
            if ratio is not None:
                metrics[f"bench/{row['variant']}/{key}_ratio"] = float(ratio)
    logger.log_metrics(metrics, step=0)
    logger.experiment.log_artifact(logger.run_id, str(json_path))
    logger.finalize("FINISHED")


# ---------------------------------------------------------------------------------------------- worker
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


class _SteadyStateProbe(L.Callback):
    """Opens the timing window at the first collection boundary past ``steady_start`` frames."""

    def __init__(self, steady_start: int, act_calls: int) -> None:
        self.steady_start = steady_start
        self.act_calls = act_calls
        self.fit_start = 0.0
        self.batches = 0
        self.opened: tuple[float, int, int] | None = None
        self.closed: tuple[float, int, int] | None = None
        self.act_ms: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.batches += 1
        dm = trainer.datamodule
        # owed_updates == 0: the batch just fetched ends a round, the next fetch collects.
        if self.opened is None and dm.frames >= self.steady_start and dm.owed_updates == 0:
            _sync(pl_module.device)
            self.opened = (time.perf_counter(), dm.frames, self.batches)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Still inside the fit: the callbacks' wrappers around the hot paths are in place.
        _sync(pl_module.device)
        self.closed = (time.perf_counter(), trainer.datamodule.frames, self.batches)
        self.act_ms = self.time_act(pl_module)

    def time_act(self, module: L.LightningModule) -> float:
        """Milliseconds per ``act`` call on fixed observations of the training envs' shape."""
        torch.manual_seed(0)
        template = module.observation_spec.rand().to(module.device)
        if "step_count" in template.keys():
            template.get("step_count").fill_(1)  # mid-episode: the planner's warm start is used
        inputs = [template.clone() for _ in range(_ACT_WARMUP + self.act_calls)]
        with torch.no_grad():
            for td in inputs[:_ACT_WARMUP]:
                module.act(td)
            _sync(module.device)
            start = time.perf_counter()
            for td in inputs[_ACT_WARMUP:]:
                module.act(td)
            _sync(module.device)
        return (time.perf_counter() - start) / self.act_calls * 1e3

    def figures(self) -> dict[str, Any]:
        if self.opened is None or self.closed is None or self.closed[0] <= self.opened[0]:
            return {"status": "failed: no steady-state window (raise bench.frames)"}
        seconds = self.closed[0] - self.opened[0]
        return {
            "status": "ok",
            "env_fps": (self.closed[1] - self.opened[1]) / seconds,
            "updates_per_s": (self.closed[2] - self.opened[2]) / seconds,
            "act_ms": self.act_ms,
            "warmup_s": self.opened[0] - self.fit_start,
            "window": {
                "seconds": seconds,
                "frames": self.closed[1] - self.opened[1],
                "updates": self.closed[2] - self.opened[2],
                "start_frame": self.opened[1],
            },
        }


def worker_main() -> None:
    """One bench run in this process: ``python -c ... worker_main()`` SPEC_JSON (written by :func:`bench`)."""
    from rl_lightning.checkpoint import FrameCheckpoint
    from rl_lightning.cli import _quiet_libraries
    from rl_lightning.commands import build_run
    from rl_lightning.evaluation import EvalCallback

    spec = json.loads(Path(sys.argv[1]).read_text())
    _quiet_libraries()
    rss_start = _peak_rss_mb()
    cfg = OmegaConf.create(spec["config"])
    run = build_run(cfg)
    cuda = run.trainer.strategy.root_device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    probe = _SteadyStateProbe(int(spec["steady_start"]), int(spec["act_calls"]))
    callbacks = run.trainer.callbacks
    callbacks[:] = [cb for cb in callbacks if not isinstance(cb, EvalCallback | FrameCheckpoint)] + [probe]
    run.trainer.fit(run.module, datamodule=run.datamodule)
    out = probe.figures()
    if cuda:
        out.update(peak_mem_mb=torch.cuda.max_memory_allocated() / 2**20, memory="CUDA max allocated")
    else:
        out.update(peak_mem_mb=_peak_rss_mb() - rss_start, memory="RSS growth")
    out["callbacks"] = [type(cb).__name__ for cb in callbacks if cb is not probe]
    out["frames"] = run.datamodule.frames
    out["updates"] = run.datamodule.updates
    Path(spec["out"]).write_text(json.dumps(out, indent=1))
