"""The experience stream under Lightning's real training loop: collections and updates interleave as the
update-to-data ratio says, with no round more, whatever Lightning's fetcher takes ahead of time."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_lightning.cli import compose
from rl_lightning.cli.run import Run, build_run
from rl_lightning.data.datamodule import MAX_UPDATES_PER_BATCH


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
    assert dm.updates == 41 and dm.owed_updates == 0


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
    assert run.datamodule.updates == 400 and run.datamodule.owed_updates == 0


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
    assert run.datamodule.updates == len(whole) and run.datamodule.owed_updates == 0


@pytest.mark.parametrize("stop_after", [1, 30])
def test_a_stop_request_ends_the_fit_between_updates(tmp_path: Path, monkeypatch, stop_after: int) -> None:
    run = small_run(tmp_path, monkeypatch, *SAC_SMALL, "total_frames=60")
    dm = run.datamodule
    dm.stop_request = lambda: dm.updates >= stop_after
    run.trainer.fit(run.module, datamodule=dm)
    assert dm.updates == stop_after and dm.frames == 20 + stop_after - 1
