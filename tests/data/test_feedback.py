"""The update's feedback through the real data path: PER priorities and n-step returns in the replay."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from helpers.cli import ReplayedRows

from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run
from rl_lightning.training.feedback import UpdateFeedback


class LastOutput(L.Callback):
    """Keeps the output of the last update and the priorities the replay held right after it."""

    def __init__(self) -> None:
        self.output = None
        self.priorities_after = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if outputs["metrics"] is None:  # a round cut short by the end of the budget
            return
        self.output = outputs["metrics"].clone()
        self.priorities_after = trainer.datamodule.replay.sampler._priority.clone()


def short_fit(tmp_path: Path, *overrides: str):
    cfg = compose(
        [
            "+experiment=dqn_cartpole",
            "logger=none",
            "device=cpu",
            "progress_bar=false",
            "total_frames=600",
            "collect.frames_per_batch=50",
            "collect.warmup_frames=200",
            "eval.every_frames=0",
            "eval.episodes=1",
            f"run_dir={tmp_path / 'run'}",
            *overrides,
        ]
    )
    run = build_run(cfg)
    recorder = LastOutput() if "replay.prioritized=true" in overrides else None
    if recorder is not None:
        # After UpdateFeedback (callbacks run in list order; checkpoints run last).
        run.trainer.callbacks.insert(run.trainer.callbacks.index(_feedback(run.trainer)) + 1, recorder)
    replayed = ReplayedRows(run.datamodule) if run.datamodule.ingestion.nstep is not None else None
    run.trainer.fit(run.module, datamodule=run.datamodule)
    return run, recorder, replayed


def _feedback(trainer: L.Trainer) -> UpdateFeedback:
    return next(cb for cb in trainer.callbacks if isinstance(cb, UpdateFeedback))


def test_per_priorities_follow_the_td_errors_of_each_update(tmp_path: Path) -> None:
    run, rec, _ = short_fit(tmp_path, "replay.prioritized=true", "replay.alpha=0.7")
    sampler = run.datamodule.replay.sampler
    index, value = rec.output["priority", "index"], rec.output["priority", "value"]
    assert index.shape == value.shape == (run.datamodule.replay_cfg.batch_size,)
    # The replay holds (|TD error| + eps) ** alpha for exactly the rows the last update sampled.
    expected = (value + sampler.eps) ** 0.7
    torch.testing.assert_close(rec.priorities_after[index], expected)
    # Updated rows differ from the fresh-transition priority: feedback reached the buffer.
    n = len(run.datamodule.replay)
    assert rec.priorities_after[:n].unique().numel() > 10


@pytest.mark.parametrize("gamma", [0.9])
def test_n_step_transitions_in_the_replay_match_hand_computed_returns(tmp_path: Path, gamma: float) -> None:
    _, _, replayed = short_fit(tmp_path, "replay.n_step=3", f"algo.gamma={gamma}")
    stored = replayed.check_stored()  # the replay keeps only the update's keys, unchanged
    steps = stored["steps_to_next_obs"].reshape(-1).float()
    reward = stored["next", "reward"].reshape(-1)
    assert steps.min() >= 1 and steps.max() == 3
    # CartPole pays 1 per step: a window of m steps returns 1 + g + ... + g^(m-1).
    torch.testing.assert_close(reward, (1 - gamma**steps) / (1 - gamma))
    # A window shorter than 3 ends its episode: it is terminal or truncated.
    short = steps < 3
    ended = stored["next", "done"].reshape(-1)
    assert short.any() and ended[short].all()


class StateWithPendingEpisodes(L.Callback):
    """The data module's state (what a checkpoint holds) at the first batch end with episodes not yet
    logged, and those episodes."""

    def __init__(self) -> None:
        self.state = None
        self.pending = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        dm = trainer.datamodule
        if self.state is None and dm.state_dict()["pending_episodes"]:
            self.state = dm.state_dict()
            self.pending = [tuple(e) for e in self.state["pending_episodes"]]


def test_episodes_not_yet_logged_at_a_checkpoint_are_logged_after_resuming(tmp_path: Path) -> None:
    # Logged every 10,000 updates: every finished episode waits for the end of the run.
    cfg = ["+experiment=dqn_cartpole", "logger=none", "device=cpu", "progress_bar=false", "total_frames=600",
           "collect.frames_per_batch=50", "collect.warmup_frames=200", "eval.every_frames=0",
           "eval.episodes=1", "log_every_n_updates=10000"]  # fmt: skip
    run = build_run(compose([*cfg, f"run_dir={tmp_path / 'a'}"]))
    snapshot = StateWithPendingEpisodes()
    run.trainer.callbacks.append(snapshot)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert snapshot.pending, "no episode ended in 600 CartPole frames"
    resumed = build_run(compose([*cfg, f"run_dir={tmp_path / 'b'}"])).datamodule
    resumed.load_state_dict(snapshot.state)
    # The count includes them, and so do the episodes the resumed run logs next.
    assert resumed.episodes == snapshot.state["episodes"]
    assert resumed.progress.episode_reader().read() == snapshot.pending
