"""The experience stream under Lightning's real training loop: collections and updates interleave as the
update-to-data ratio says, with no round more, whatever Lightning's fetcher takes ahead of time."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from rl_lightning.cli import compose
from rl_lightning.cli.run import Run, build_run
from rl_lightning.data.budget import Mark
from rl_lightning.data.ingest import rows as replay_rows
from rl_lightning.data.stream import MAX_UPDATES_PER_BATCH
from rl_lightning.training.evaluation import EvalCallback


def small_run(tmp_path: Path, monkeypatch, *overrides: str) -> Run:
    """A small run in ``tmp_path``, without logger or evaluations."""
    tmp_path.mkdir(exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return build_run(compose([
        "logger=none", "device=cpu", "progress_bar=false", "eval.every_frames=0", "eval.episodes=1",
        "replay.batch_size=8", *overrides,
    ]))  # fmt: skip


def fit(tmp_path: Path, monkeypatch, *overrides: str) -> tuple[list[int], Run]:
    """Fits a small run in ``tmp_path``; returns the frames collected at each update, and the run."""
    run = small_run(tmp_path, monkeypatch, *overrides)
    frames_at_update: list[int] = []
    update = run.module.update

    def recording_update(batch):
        frames_at_update.append(run.datamodule.frames)
        return update(batch)

    run.module.update = recording_update
    run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=run.ckpt_path)
    return frames_at_update, run


SAC_SMALL = ("+experiment=sac_pendulum", "algo.hidden_sizes=[16,16]", "collect.warmup_frames=20")


def test_one_frame_one_update_alternate_and_the_run_ends_owing_nothing(tmp_path: Path, monkeypatch) -> None:
    frames_at_update, run = fit(tmp_path, monkeypatch, *SAC_SMALL, "total_frames=60")
    dm = run.datamodule
    # The collection that completes the warm-up grants the first update; then one update per frame, each
    # after its own frame and before the next one.
    assert frames_at_update == list(range(20, 61))
    assert dm.updates == 41 and dm.budget.owed == 0


DQN_SMALL = (
    "+experiment=dqn_cartpole", "algo.hidden_sizes=[16,16]", "collect.frames_per_batch=200",
    "collect.warmup_frames=200",
)  # fmt: skip


def test_the_rounds_of_a_collection_follow_it_and_precede_the_next(tmp_path: Path, monkeypatch) -> None:
    frames_at_update, run = fit(tmp_path, monkeypatch, *DQN_SMALL, "total_frames=800")
    # 200 frames per collection at 0.5 updates per frame: 100 updates after each collection, in rounds of
    # at most MAX_UPDATES_PER_BATCH (a round of 64, then one of 36), all before the next collection.
    assert 100 % MAX_UPDATES_PER_BATCH != 0
    assert frames_at_update == [f for f in (200, 400, 600, 800) for _ in range(100)]
    assert run.datamodule.updates == 400 and run.datamodule.budget.owed == 0


@pytest.mark.parametrize("overrides", [SAC_SMALL, DQN_SMALL], ids=["sac", "dqn"])
def test_a_resumed_run_does_the_updates_of_an_uninterrupted_one(
    tmp_path: Path, monkeypatch, overrides
) -> None:
    frames, cut = (60, 40) if overrides is SAC_SMALL else (800, 400)
    whole, _ = fit(tmp_path / "whole", monkeypatch, *overrides, f"total_frames={frames}")
    first, run = fit(tmp_path / "split", monkeypatch, *overrides, f"total_frames={cut}")
    last = run.run_dir / "checkpoints" / "last.ckpt"
    second, run = fit(
        tmp_path / "split", monkeypatch, *overrides, f"total_frames={frames}", f"ckpt_path={last}"
    )
    assert first + second == whole
    assert run.datamodule.updates == len(whole) and run.datamodule.budget.owed == 0


@pytest.mark.parametrize("stop_after", [1, 30])
def test_a_stop_request_ends_the_fit_between_updates(tmp_path: Path, monkeypatch, stop_after: int) -> None:
    run = small_run(tmp_path, monkeypatch, *SAC_SMALL, "total_frames=60")
    dm = run.datamodule
    dm.stop_request = lambda: dm.updates >= stop_after
    run.trainer.fit(run.module, datamodule=dm)
    assert dm.updates == stop_after and dm.frames == 20 + stop_after - 1


class BatchEnds(L.Callback):
    """Records ``(frames, updates in the batch)`` at every batch end; ``every_collection``: with a mark
    registered with the budget that is always due, else without one (the stream may then group
    collections)."""

    def __init__(self, every_collection: bool) -> None:
        self.ends: list[tuple[int, int]] = []
        self.every_collection = every_collection

    def setup(self, trainer, pl_module, stage) -> None:
        if self.every_collection:
            trainer.datamodule.progress.register_mark(Mark("frames", every=0))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.ends.append((trainer.datamodule.frames, outputs["updates"]))


def grouped_fit(tmp_path: Path, monkeypatch, every_collection: bool, *overrides: str):
    run = small_run(tmp_path, monkeypatch, *SAC_SMALL, *overrides)
    ends = BatchEnds(every_collection)
    run.trainer.callbacks.append(ends)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    weights = {k: v.clone() for k, v in run.module.state_dict().items()}
    return ends.ends, weights, run


@pytest.mark.slow
def test_one_frame_collections_share_a_batch_until_a_callback_is_due(tmp_path: Path, monkeypatch) -> None:
    args = ("total_frames=300", "eval.every_frames=150", "checkpoint.every_frames=100")
    ends, grouped, run = grouped_fit(tmp_path / "grouped", monkeypatch, False, *args)
    updates = [n for _, n in ends]
    assert sum(updates) == run.datamodule.updates == 281 and max(updates) == MAX_UPDATES_PER_BATCH
    # Every evaluation and checkpoint frame is a batch end, where those callbacks ran on time, and so is
    # every 100th update (frame 19 + k holds update k), where the update feedback logs.
    frames = [f for f, _ in ends]
    assert {100, 119, 150, 200, 219, 300}.issubset(frames) and len(ends) < 14
    evals = next(cb for cb in run.trainer.callbacks if isinstance(cb, EvalCallback))
    assert evals.done_frames == 300 and run.datamodule.budget.owed == 0
    # A callback due at every frame count gets one collection per batch, with the same updates to the bit.
    ends, alone, _ = grouped_fit(tmp_path / "alone", monkeypatch, True, *args)
    assert ends == [(20 + i, 1) for i in range(281)] + [(300, 0)]  # the last batch finds the budget spent
    assert all(torch.equal(grouped[k], alone[k]) for k in grouped)


def test_rows_of_a_collected_batch_are_select_then_reshape() -> None:
    """The replay's rows of a ``[num_envs, T]`` batch: the stored keys (nested ones, absent ones skipped),
    one row per frame, the same as TensorDict's select and reshape, for plain batches and lazy stacks."""
    n, t = 3, 4
    batch = TensorDict(
        {
            "observation": torch.randn(n, t, 2),
            "action": torch.randint(0, 3, (n, t)),
            "episode_reward": torch.randn(n, t, 1),
            "next": {"observation": torch.randn(n, t, 2), "reward": torch.randn(n, t, 1)},
        },
        [n, t],
    )
    keys = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "absent"))
    expected = batch.select(*keys, strict=False).reshape(-1)
    for data in (batch, LazyStackedTensorDict.lazy_stack(list(batch.unbind(0)), 0)):
        rows = replay_rows(data, keys)
        assert rows.batch_size == torch.Size([n * t])
        assert set(rows.keys(True, True)) == set(expected.keys(True, True))
        assert (rows == expected).all()
    nested_lazy = batch.clone()  # a nested entry that is not a plain TensorDict is kept, not skipped
    nested_lazy.set("next", LazyStackedTensorDict.lazy_stack(list(batch.get("next").unbind(1)), 1))
    assert (replay_rows(nested_lazy, keys) == expected).all()
    for data in (batch, nested_lazy):  # every key (TD-MPC2's slices store all)
        rows, reshaped = replay_rows(data, None), data.reshape(-1)
        assert set(rows.keys(True, True)) == set(reshaped.keys(True, True))
        assert (rows == reshaped).all()
    assert "episode_reward" not in replay_rows(batch, keys).keys()
