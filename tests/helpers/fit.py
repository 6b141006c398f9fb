"""Fits that several test modules share.

- The callback fits: ``FixedBatches``, the train iterable of the same ``K`` batches every epoch (the
  batches themselves come from :func:`helpers.batches.transition_data`); ``K`` updates (and ``act`` calls)
  per run, on ``ACT_N`` observations each, unless a test says otherwise.
- A short fit through the real data module with prioritized 3-step replay
  (:func:`fit_with_per_and_n_step`) and its checks (:func:`check_per_and_n_step`), which the SAC and the
  TD3/DDPG tests run on their experiments.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lightning as L
import torch
from tensordict import TensorDictBase

from helpers.cli import ReplayedRows
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run
from rl_lightning.training.feedback import UpdateFeedback

K = 4  # updates (and act calls) per run
ACT_N = 32  # observations per act call


class FixedBatches:
    """The train iterable: the same ``K`` batches, cloned, every time."""

    def __init__(self, batches: list[TensorDictBase]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[TensorDictBase]:
        return (b.clone() for b in self.batches)


# ------------------------------------------------------------------ through the real data path
class LastOutput(L.Callback):
    """Keeps the last update's output and the replay's priorities right after it (after UpdateFeedback)."""

    def __init__(self) -> None:
        self.output = None
        self.priorities_after = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # ``training_step`` returns the update's output, or {"metrics": the round's last output, ...}.
        output = outputs.get("metrics") if isinstance(outputs, dict) else outputs
        if output is None:  # a round cut short by the end of the budget
            return
        self.output = output.clone()
        self.priorities_after = trainer.datamodule.replay.sampler._priority.clone()


def fit_with_per_and_n_step(tmp_path: Path, experiment: str, gamma: float = 0.9):
    """A short fit of ``experiment`` with prioritized 3-step replay through the real data module."""
    cfg = compose(
        [
            f"+experiment={experiment}",
            "logger=none",
            "device=cpu",
            "progress_bar=false",
            "total_frames=600",
            "collect.frames_per_batch=50",
            "collect.warmup_frames=200",
            "collect.updates_per_frame=0.25",
            "replay.batch_size=32",
            "replay.prioritized=true",
            "replay.alpha=0.7",
            "replay.n_step=3",
            "algo.hidden_sizes=[32,32]",
            f"algo.gamma={gamma}",
            "eval.every_frames=0",
            "eval.episodes=1",
            f"run_dir={tmp_path / 'run'}",
        ]
    )
    run = build_run(cfg)
    recorder = LastOutput()
    feedback = next(cb for cb in run.trainer.callbacks if isinstance(cb, UpdateFeedback))
    run.trainer.callbacks.insert(run.trainer.callbacks.index(feedback) + 1, recorder)
    recorder.rows = ReplayedRows(run.datamodule)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    return run, recorder


def check_per_and_n_step(run, recorder: LastOutput) -> None:
    """The replay holds the priorities the last update returned, and 3-step windows that stop at ends."""
    dm = run.datamodule
    sampler = dm.replay.sampler
    index, value = recorder.output["priority", "index"], recorder.output["priority", "value"]
    assert index.shape == value.shape == (dm.replay_cfg.batch_size,)
    # Rows drawn twice carry two TD errors (sampled target actions differ): compare rows drawn once.
    once = (index.unsqueeze(0) == index.unsqueeze(1)).sum(0) == 1
    torch.testing.assert_close(recorder.priorities_after[index[once]], (value[once] + sampler.eps) ** 0.7)
    n = len(dm.replay)
    assert recorder.priorities_after[:n].unique().numel() > 10  # feedback reached the buffer many times
    rows = recorder.rows.check_stored()  # the replay keeps only the update's keys, unchanged
    steps = rows["steps_to_next_obs"].reshape(-1)
    assert steps.min() >= 1 and steps.max() == 3
    short = steps < 3  # a window shorter than 3 steps ends its episode
    assert short.any() and rows["next", "done"].reshape(-1)[short].all()
