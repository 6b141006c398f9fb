"""Evaluation of the deterministic policy on separate envs, as a function and as a callback."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.loggers import MLFlowLogger
from typing_extensions import override

from rl_lightning.data.budget import Mark
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.agents import act_rows, agent_group
from rl_lightning.envs.factory import EnvConfig, make_env
from rl_lightning.training.metrics import log_metrics
from rl_lightning.training.video import record_video

__all__ = [
    "OUTCOME_RATES", "SUCCESS_MEANS", "EvalCallback", "EvaluationStopped", "VideoSettings", "evaluate_policy",
    "evaluate_variants",
]  # fmt: skip

#: Episode outcomes an env may write into ``next`` at an episode's end (0/1 flags; marine navigation's,
#: in the public evaluation's terms): each becomes ``<name>_rate``.
OUTCOME_RATES = ("success", "collision", "timeout")
#: Episode figures an env may write at an episode's end, averaged over the successful episodes only (the
#: public marine-navigation evaluation's travel time, energy and path length): ``<name>_mean``.
SUCCESS_MEANS = ("travel_time", "energy", "path_length")


@dataclass
class VideoSettings:
    """Videos recorded with evaluations during ``fit`` (the ``eval.video`` node)."""

    dir: Path
    every_frames: int = 0
    episodes: int = 1
    format: str = "gif"
    fps: int = 30


class EvaluationStopped(Exception):
    """An evaluation was abandoned because a stop was requested (Ctrl-C) while it ran."""


@torch.no_grad()
def evaluate_policy(
    module: L.LightningModule,
    env_cfg: EnvConfig,
    episodes: int,
    seed: int,
    should_stop: Callable[[], bool] | None = None,
    copies: DeviceCopies | None = None,
) -> dict[str, float]:
    """Runs ``episodes`` whole episodes with ``module.act_eval`` and summarises them.

    Reproducible: the eval envs are seeded with ``seed`` and the policy's own randomness (a planner's
    samples) draws from a torch generator seeded with ``seed`` too, forked so that the training run's
    random stream is left as it was. The same weights, seed and env config give the same figures, during
    training and in ``evaluate``.

    Args:
        module: an algorithm module (its ``act_eval`` is used; its train/eval mode is restored after).
        env_cfg: the env to evaluate on (``eval_num_envs`` envs side by side).
        episodes: how many episodes to count. With ``n`` envs each env contributes its first
            ``episodes // n`` (or one more) episodes, so long episodes count as often as short ones.
        seed: the eval envs' seed.
        should_stop: checked before every env step; when it returns True the evaluation is abandoned.
        copies: the run's device copies, through which the observations go to the module and its actions
            come back (routes ``eval_observations`` and ``eval_actions``); ``None``: plain copies of its
            own (an evaluation outside a fit).

    Raises:
        EvaluationStopped: ``should_stop()`` became True.

    Returns:
        ``return_mean``, ``return_std``, ``length_mean``, and, where the env reports ``winner``
        (hockey), ``win_rate``, ``loss_rate`` and ``draw_rate`` (draws are not wins); where it reports
        outcomes (marine navigation, :data:`OUTCOME_RATES`), ``success_rate``, ``collision_rate`` and
        ``timeout_rate``, with ``travel_time_mean``, ``energy_mean`` and ``path_length_mean`` over the
        successful episodes (NaN without one). An env with an agent group acts through one policy call
        per step for all its agents.
    """
    if episodes < 1:
        raise ValueError("episodes must be >= 1.")
    n_envs = min(env_cfg.eval_num_envs, episodes)
    # Each env plays a fixed number of episodes, its first ones. Keeping the first ``episodes`` to finish
    # across envs instead would favour short episodes (in hockey: goals over draws).
    quota = torch.tensor([episodes // n_envs + (i < episodes % n_envs) for i in range(n_envs)])
    env = make_env(env_cfg, num_envs=n_envs, seed=seed)
    was_training = module.training
    module.eval()
    returns: list[float] = []
    lengths: list[float] = []
    winners: list[float] = []
    outcomes: dict[str, list[float]] = {}
    devices = [module.device] if module.device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            copies = copies or DeviceCopies(module.device, module.device)
            _play(module, env, copies, quota, returns, lengths, winners, outcomes, should_stop)
    finally:
        env.close()
        module.train(was_training)
    mean = sum(returns) / len(returns)
    out = {
        "return_mean": mean,
        "return_std": math.sqrt(sum((r - mean) ** 2 for r in returns) / len(returns)),
        "length_mean": sum(lengths) / len(lengths),
    }
    if winners:
        out["win_rate"] = sum(w > 0 for w in winners) / len(winners)
        out["loss_rate"] = sum(w < 0 for w in winners) / len(winners)
        out["draw_rate"] = sum(w == 0 for w in winners) / len(winners)
    for key in OUTCOME_RATES:
        if key in outcomes:
            out[f"{key}_rate"] = sum(v > 0.5 for v in outcomes[key]) / len(outcomes[key])
    if "success" in outcomes:
        won = [i for i, v in enumerate(outcomes["success"]) if v > 0.5]
        for key in SUCCESS_MEANS:
            if key in outcomes:
                out[f"{key}_mean"] = sum(outcomes[key][i] for i in won) / len(won) if won else math.nan
    return out


def _play(
    module: L.LightningModule,
    env: Any,
    copies: DeviceCopies,
    quota: torch.Tensor,
    returns: list[float],
    lengths: list[float],
    winners: list[float],
    outcomes: dict[str, list[float]],
    should_stop: Callable[[], bool] | None,
) -> None:
    """Steps ``env`` with ``module.act_eval`` until every env has played its ``quota`` of episodes."""
    n_envs = quota.numel()
    group = agent_group(env)

    def act(rows: Any) -> Any:
        return copies.to_env(module.act_eval(copies.to_policy(rows, "eval_observations")), "eval_actions")

    td = env.reset()
    while (quota > 0).any():
        if should_stop is not None and should_stop():
            raise EvaluationStopped
        td = act_rows(act, td, group)
        td, td_next = env.step_and_maybe_reset(td)
        nxt = td.get("next")
        done = nxt.get("done").reshape(n_envs)
        if done.any():
            counted = done & (quota > 0)
            quota -= done.long()
            returns += nxt.get("episode_reward")[counted].reshape(-1).tolist()
            lengths += nxt.get("step_count")[counted].reshape(-1).tolist()
            if "winner" in nxt.keys():
                winners += nxt.get("winner")[counted].reshape(-1).tolist()
            for key in (*OUTCOME_RATES, *SUCCESS_MEANS):
                if key in nxt.keys():
                    outcomes.setdefault(key, []).extend(nxt.get(key)[counted].reshape(-1).tolist())
        td = td_next


def evaluate_variants(
    module: L.LightningModule,
    env_cfg: EnvConfig,
    episodes: int,
    seed: int,
    variants: Mapping[str, Mapping[str, Any]] | None = None,
    should_stop: Callable[[], bool] | None = None,
    copies: DeviceCopies | None = None,
) -> dict[str, float]:
    """Evaluates on the env and, per variant, on the env with its ``kwargs`` overridden.

    Without variants the keys are those of :func:`evaluate_policy`. With variants (for example hockey's
    ``{weak: {opponent: weak}, strong: {opponent: strong}}``) each variant's keys are prefixed
    ``<variant>/`` and the unprefixed keys are the means over the variants.
    """
    if not variants:
        return evaluate_policy(module, env_cfg, episodes, seed, should_stop, copies)
    out: dict[str, float] = {}
    per_variant = []
    for name, overrides in variants.items():
        cfg = dataclasses.replace(env_cfg, kwargs={**env_cfg.kwargs, **overrides})
        stats = evaluate_policy(module, cfg, episodes, seed, should_stop, copies)
        per_variant.append(stats)
        out.update({f"{name}/{k}": v for k, v in stats.items()})
    for key in per_variant[0]:
        out[key] = sum(s[key] for s in per_variant) / len(per_variant)
    return out


class EvalCallback(L.Callback):
    """Evaluates every ``every_frames`` environment frames and when the run reaches its frame budget.

    Logs ``eval/return_mean``, ``eval/return_std``, ``eval/length_mean`` (and ``eval/win_rate``,
    ``eval/loss_rate``, ``eval/draw_rate`` where the env reports a winner; ``eval/<variant>/...`` per
    variant) against frames; the checkpoint callback monitors one of them for ``best.ckpt``. Each result
    is printed on its own line through the progress bar (above it). A run stopped before its budget
    (Ctrl-C) is not evaluated at its end, and an evaluation in progress stops between env steps when a
    stop is requested (``should_stop``). Frames come from the data path's progress view
    (``trainer.datamodule.progress``), with which the evaluation registers its mark.

    Args:
        env: the env config (the eval envs are separate from the training envs).
        every_frames: evaluation interval in frames (0 disables periodic evaluation).
        episodes: episodes per evaluation.
        seed: the eval envs' seed (the same every time, so evaluations are comparable).
        variants: env kwargs overrides to evaluate separately (see :func:`evaluate_variants`).
        should_stop: returns True when the run was asked to stop (Ctrl-C); ``None``: never.
        video: ``None`` (no videos), or where and how to record one with an evaluation at least
            ``video.every_frames`` frames after the last: :class:`VideoSettings`. Videos are logged as
            MLflow artifacts under ``videos/``.
    """

    def __init__(
        self,
        env: EnvConfig,
        every_frames: int,
        episodes: int = 10,
        seed: int = 10_000,
        variants: Mapping[str, Mapping[str, Any]] | None = None,
        should_stop: Callable[[], bool] | None = None,
        video: VideoSettings | None = None,
    ) -> None:
        if every_frames < 0 or episodes < 1:
            raise ValueError("eval.every_frames must be >= 0 and eval.episodes >= 1.")
        self.env = env
        self.every_frames = every_frames
        self.episodes = episodes
        self.seed = seed
        self.variants = dict(variants or {})
        self.should_stop = should_stop
        self.video = video
        self.mark = Mark("frames", every_frames or math.inf)
        self._video_frames: int | None = None
        self.last: dict[str, float] = {}

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        progress = trainer.datamodule.progress
        frames = progress.frames
        stats = None
        if trainer.is_global_zero:  # one evaluation; every rank gets its result (best.ckpt is collective)
            try:
                stats = evaluate_variants(
                    pl_module, self.env, self.episodes, self.seed, self.variants, self.should_stop,
                    progress.copies,
                )  # fmt: skip
            except EvaluationStopped:
                stats = None
        if trainer.world_size > 1:
            stats = trainer.strategy.broadcast(stats, src=0)
        if stats is None:
            return
        self.last = log_metrics(trainer, {f"eval/{k}": v for k, v in stats.items()}, frames)
        self.mark.last = frames
        line = f"eval @ {frames} frames: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}"
        if "win_rate" in stats:
            line += (
                f", win/loss/draw {stats['win_rate']:.2f}/{stats['loss_rate']:.2f}/{stats['draw_rate']:.2f}"
            )
        if "success_rate" in stats:
            line += ", success/collision/timeout " + "/".join(
                f"{stats[f'{k}_rate']:.2f}" for k in OUTCOME_RATES
            )
        if trainer.is_global_zero:
            bar = trainer.progress_bar_callback
            (bar.print if bar is not None and bar.is_enabled else print)(line)
            self._maybe_video(trainer, pl_module, frames, progress.copies)

    def _maybe_video(
        self, trainer: L.Trainer, pl_module: L.LightningModule, frames: int, copies: DeviceCopies
    ) -> None:
        video = self.video
        if video is None or not video.every_frames:
            return
        if self._video_frames is not None and frames - self._video_frames < video.every_frames:
            return
        path = record_video(
            pl_module,
            self.env,
            video.dir / f"eval_{frames}.{video.format}",
            video.episodes,
            self.seed,
            video.fps,
            copies=copies,
        )
        self._video_frames = frames
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_artifact(logger.run_id, str(path), "videos")

    @property
    def done_frames(self) -> int:
        """The frame count of the last evaluation (0 before the first)."""
        return self.mark.last

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":  # the batch that reaches the next periodic evaluation ends there
            trainer.datamodule.progress.register_mark(self.mark)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.datamodule.progress.due(self.mark):
            self._run(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        progress = trainer.datamodule.progress
        if progress.frames != self.mark.last and progress.spent:  # not after a stop before the budget
            self._run(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"done_frames": self.mark.last, "last": self.last, "video_frames": self._video_frames}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.mark.last = int(state_dict["done_frames"])
        self.last = state_dict["last"]
        self._video_frames = state_dict.get("video_frames")
