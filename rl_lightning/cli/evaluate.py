"""``python -m rl_lightning evaluate ckpt=PATH``: the deterministic policy of a checkpoint, evaluated."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.process import apply_process_settings
from rl_lightning.cli.run import CONFIG_KEY, build_module, container, env_config, make_logger
from rl_lightning.data.replay import resolve_device
from rl_lightning.training.evaluation import evaluate_variants

__all__ = ["evaluate", "load_checkpoint"]


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Loads a checkpoint written by ``fit`` (on the CPU)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if CONFIG_KEY not in ckpt:
        raise ValueError(f"{path} was not written by rl_lightning fit (it has no stored config).")
    return ckpt


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Reloads ``cfg.ckpt`` and evaluates its deterministic policy for ``cfg.episodes`` episodes."""
    if cfg.ckpt is None:
        raise ValueError("evaluate needs ckpt=PATH (a checkpoint written by fit).")
    apply_process_settings(cfg)
    ckpt = load_checkpoint(cfg.ckpt)
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    env_cfg = env_config(saved)
    module = build_module(saved, env_cfg)
    module.load_state_dict(ckpt["state_dict"])
    module.to(resolve_device(cfg.device))
    seed = int(cfg.seed) + 20_000
    stats = evaluate_variants(module, env_cfg, int(cfg.episodes), seed, container(saved.eval.variants))
    print(f"{cfg.episodes} episodes: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}")
    print(json.dumps({k: round(v, 4) for k, v in stats.items()}))
    if cfg.logger:
        eval_cfg = OmegaConf.merge(cfg, {"logger": {"run_name": f"{saved.name}-evaluate"}})
        logger = make_logger(eval_cfg, Path(cfg.run_dir))
        logger.log_hyperparams(
            {"ckpt": str(Path(cfg.ckpt).resolve()), "episodes": cfg.episodes, "run": saved.name}
        )
        logger.log_metrics({f"evaluate/{k}": v for k, v in stats.items() if math.isfinite(v)}, step=0)
        logger.finalize("FINISHED")
    return stats
