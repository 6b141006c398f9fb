"""Building and running the bench's variants: one fresh ``fit`` process per variant and round."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.config import CONF_DIR, compose

__all__ = ["GPU_ONLY", "callbacks_node", "check_frames", "check_variants", "run_once", "steady_start"]

#: Callbacks that do nothing without CUDA (each says "CPU: no-op" in its config file).
GPU_ONLY = frozenset({"non_blocking", "tf32", "cuda_graphs", "gpu_monitor", "cuda_cache"})
_ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Failed|Interrupt)\b")


def check_variants(names: list[str]) -> list[str]:
    known = sorted(p.stem for p in (CONF_DIR / "callbacks").glob("*.yaml"))
    unknown = [n for n in names if n not in known]
    if unknown or len(set(names)) != len(names):
        raise ValueError(
            f"bench.variants={names}: {'unknown ' + str(unknown) if unknown else 'duplicates'}; "
            f"choose among {known}."
        )
    return names


def steady_start(cfg: DictConfig) -> int:
    """Frame count after which the steady-state window may open (warm-up plus one policy collection)."""
    fpb = int(cfg.collect.frames_per_batch)
    return math.ceil(int(cfg.collect.warmup_frames) / fpb) * fpb + fpb


def check_frames(cfg: DictConfig, frames: int) -> None:
    fpb = int(cfg.collect.frames_per_batch)
    need = steady_start(cfg) + 2 * fpb
    if frames < need:
        raise ValueError(
            f"bench.frames={frames} leaves less than two collections of steady state after the warm-up "
            f"(collect.warmup_frames={cfg.collect.warmup_frames}, frames_per_batch={fpb}); use "
            f"bench.frames>={need} or lower collect.warmup_frames."
        )


def callbacks_node(cfg: DictConfig, name: str | None) -> dict[str, Any]:
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


def run_once(cfg: DictConfig, callbacks: dict[str, Any], run_dir: Path, index: int) -> dict:
    """One variant process: writes its spec and config into ``run_dir``, returns its figures or status."""
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {
        "config": _variant_config(cfg, callbacks, run_dir),
        "steady_start": steady_start(cfg),
        "act_calls": int(cfg.bench.act_calls),
        "out": str(run_dir / f"result{index}.json"),
    }
    spec_path = run_dir / f"spec{index}.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log = run_dir / f"run{index}.log"
    code = "from rl_lightning.cli.bench.timing import worker_main; worker_main()"
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
