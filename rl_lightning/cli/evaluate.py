"""``python -m rl_lightning evaluate ckpt=PATH``: the deterministic policy of a checkpoint, evaluated."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from rl_lightning.algos.quantile.math import check_risk
from rl_lightning.cli.process import apply_process_settings
from rl_lightning.cli.run import (
    check_env_imports,
    container,
    env_config,
    make_logger,
    restore_module,
    seed_sets,
)
from rl_lightning.device import resolve_device
from rl_lightning.training.evaluation import OUTCOME_RATES, evaluate_variants
from rl_lightning.training.loggers import is_mlflow
from rl_lightning.training.protocol import SPLITS, check_disjoint
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint
from rl_lightning.training.stats import wilson
from rl_lightning.training.video import check_video_format, record_video

__all__ = ["episodes_to_play", "evaluate", "outcome_intervals", "set_risk"]


def set_risk(saved: DictConfig, cfg: DictConfig) -> None:
    """Applies ``risk=``/``risk_param=`` to the checkpoint's ``saved`` config: the distortion IQN acts with.

    The weights are the same under any distortion (it only reweights the sampled fractions when acting), so
    a risk-neutral run evaluates risk-averse (``risk=cvar risk_param=0.25``) without training again.

    Raises:
        ValueError: the checkpoint's algorithm does not act with a distortion (AC-IQN's shapes its actor's
            training objective only), or the distortion is invalid.
    """
    risk, eta = cfg.get("risk"), cfg.get("risk_param")
    if risk is None and eta is None:
        return
    cls = get_class(saved.algo._target_)
    if not getattr(cls, "acts_with_risk", False):
        raise ValueError(
            f"risk=/risk_param= choose the distortion IQN acts with; {cls.__name__} does not act with one "
            "(AC-IQN's distorts its actor's training objective: set algo.risk when training it)."
        )
    if risk is not None:
        saved.algo.risk = str(risk)
    if eta is not None:
        saved.algo.risk_param = float(eta)
    check_risk(saved.algo.risk, float(saved.algo.risk_param))


def outcome_intervals(stats: dict[str, float], episodes: int) -> list[str]:
    """One line per episode outcome rate in ``stats`` (marine navigation's success, collision and timeout)
    with its Wilson 95% interval over ``episodes``; adds ``<rate>_low`` and ``<rate>_high`` to ``stats``."""
    lines = []
    for name in OUTCOME_RATES:
        key = f"{name}_rate"
        if key not in stats:
            continue
        w = wilson(round(stats[key] * episodes), episodes)
        stats[f"{key}_low"], stats[f"{key}_high"] = w["low"], w["high"]
        lines.append(f"  {name:<9} {w['value']:.3f}  [{w['low']:.3f}, {w['high']:.3f}]  (Wilson 95%)")
    return lines


def episodes_to_play(cfg: DictConfig, saved: DictConfig) -> tuple[str, int, int]:
    """``(label, episodes, seed)`` of the evaluation ``cfg`` asks for on the run ``saved``.

    ``split=test`` (the default) plays ``eval.test_episodes`` held-out episodes from ``eval.test_seed``,
    refused when those seeds meet the run's training or validation seeds; ``split=validation`` replays the
    run's own evaluation (its ``eval.episodes`` from its ``eval.seed``: the score that made ``best.ckpt``
    best). ``episodes=N`` changes the count; ``eval_seed=S`` plays other episodes, labelled ``seed S``.
    """
    if cfg.split not in SPLITS:
        raise ValueError(f"split={cfg.split}: choose one of {', '.join(SPLITS)}.")
    test = cfg.split == "test"
    default = cfg.eval.test_episodes if test else saved.eval.episodes
    episodes = int(cfg.episodes if cfg.episodes is not None else default)
    if cfg.eval_seed is not None:
        return f"seed {int(cfg.eval_seed)}", episodes, int(cfg.eval_seed)
    if not test:
        return "validation", episodes, int(saved.eval.seed)
    seed = int(cfg.eval.test_seed)
    check_disjoint(seed_sets(saved, seed, episodes))
    return "test", episodes, seed


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Reloads ``cfg.ckpt`` safely and evaluates its deterministic policy.

    By default on held-out test episodes (:func:`episodes_to_play`; docs/evaluation.md), the figure to
    report; ``split=validation`` reproduces the run's own evaluation, on its eval envs and variants.
    ``video=true`` also writes a video of ``eval.video.episodes`` episodes beside the checkpoint (and logs
    it as an MLflow artifact).
    ``plan=true|false`` evaluates a TD-MPC2 checkpoint with or without the planner, whichever its run used
    (``algo.mpc`` only chooses how the module acts: the weights are the same); with ``plan=true``,
    ``planner.horizon=3`` (``iterations``, ``num_samples``, ...) plans with other settings than the run's.
    ``risk=cvar risk_param=0.25`` evaluates an IQN checkpoint acting risk-averse (:func:`set_risk`). Where the
    env reports episode outcomes (marine navigation), their rates are printed with Wilson 95% intervals.
    """
    if cfg.ckpt is None:
        raise ValueError("evaluate needs ckpt=PATH (a checkpoint written by fit).")
    if cfg.split not in SPLITS:
        raise ValueError(f"split={cfg.split}: choose one of {', '.join(SPLITS)}.")
    apply_process_settings(cfg)
    if cfg.video:
        check_video_format(cfg.eval.video.format)
    ckpt = load_checkpoint(cfg.ckpt)  # safe: weights only, targets checked, older formats migrated
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    if cfg.get("plan") is not None:
        if "mpc" not in saved.algo:
            raise ValueError(
                f"plan={cfg.plan} chooses how TD-MPC2 acts; this checkpoint's algorithm has no planner."
            )
        saved.algo.mpc = bool(cfg.plan)
    changed = {k: v for k, v in container(cfg.get("planner") or {}).items() if v is not None}
    if changed:
        if "mpc" not in saved.algo or not saved.algo.mpc:
            raise ValueError("planner.* sets how TD-MPC2 plans in evaluation: add plan=true (TD-MPC2 only).")
        saved.algo.update(changed)
    set_risk(saved, cfg)
    check_env_imports(saved, cfg)
    env_cfg = env_config(saved)
    module = restore_module(ckpt, saved, env_cfg)
    module.to(resolve_device(cfg.device))
    label, episodes, seed = episodes_to_play(cfg, saved)
    stats = evaluate_variants(module, env_cfg, episodes, seed, container(saved.eval.variants))
    line = f"{label}: {episodes} episodes (eval seed {seed}): "
    line += f"return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}"
    if "win_rate" in stats:
        line += ", win/loss/draw " + "/".join(
            f"{stats[k]:.2f}" for k in ("win_rate", "loss_rate", "draw_rate")
        )
    acts_risky = getattr(module, "acts_with_risk", False) and saved.algo.risk != "neutral"
    if acts_risky:
        line += f" [acting {saved.algo.risk}({saved.algo.risk_param})]"
    print(line)
    for outcome in outcome_intervals(stats, episodes):
        print(outcome)
    video = None
    if cfg.video:
        v = cfg.eval.video
        video = Path(cfg.ckpt).with_name(f"{Path(cfg.ckpt).stem}-video.{v.format}")
        record_video(module, env_cfg, video, int(v.episodes), seed, int(v.fps))
        print(f"video of {v.episodes} episode(s): {video}")
    print(json.dumps({k: round(v, 4) for k, v in stats.items()}))
    if cfg.logger:
        eval_cfg = OmegaConf.merge(cfg, {"logger": {"run_name": f"{saved.name}-evaluate"}})
        logger = make_logger(eval_cfg, Path(cfg.run_dir))
        logger.log_hyperparams(
            {
                "ckpt": str(Path(cfg.ckpt).resolve()),
                "episodes": episodes,
                "eval_seed": seed,
                "split": label,
                "run": saved.name,
                **({"plan": bool(cfg.plan)} if cfg.get("plan") is not None else {}),
                **({"risk": saved.algo.risk, "risk_param": saved.algo.risk_param} if acts_risky else {}),
            }
        )
        logger.log_metrics({f"evaluate/{k}": v for k, v in stats.items() if math.isfinite(v)}, step=0)
        if video is not None and is_mlflow(logger):
            logger.experiment.log_artifact(logger.run_id, str(video), "videos")
        logger.finalize("success")
    return stats
