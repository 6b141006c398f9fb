"""TD-MPC2's seeding burst (``collect.warmup_burst``): after the warm-up, one update per warm-up frame.

The reference trainer runs ``num_updates = seed_steps`` updates at the step the seeding ends and one per
step after it; the burst is not scaled by the update-to-data ratio, which only sets the steady rate.
"""

from __future__ import annotations

import pytest

from rl_lightning.algos.base import ReplayRequirements
from rl_lightning.data.datamodule import CollectConfig, RLDataModule
from rl_lightning.data.replay import ReplayConfig
from rl_lightning.envs.factory import EnvConfig


def data_module(updates_per_frame: float, warmup_frames: int = 1000, burst: bool = True) -> RLDataModule:
    collect = CollectConfig(
        total_frames=10_000,
        frames_per_batch=8,
        warmup_frames=warmup_frames,
        updates_per_frame=updates_per_frame,
        warmup_burst=burst,
    )
    return RLDataModule(
        EnvConfig(id="Pendulum-v1"), ReplayConfig(device="cpu"), collect, ReplayRequirements()
    )


def grants(dm: RLDataModule, collections: int, frames_per_batch: int = 8) -> list[int]:
    """Updates granted by each collection, as the experience stream asks once the warm-up is in."""
    out = []
    for _ in range(collections):
        dm.frames += frames_per_batch * dm.world_size
        if dm.frames >= dm.collect.warmup_frames:
            out.append(dm.updates_due(frames_per_batch))
    return out


@pytest.mark.parametrize("updates_per_frame", [0.25, 0.5, 1.0, 2.0])
def test_the_burst_is_one_update_per_warmup_frame_whatever_the_ratio(updates_per_frame: float) -> None:
    dm = data_module(updates_per_frame)
    first, *steady = grants(dm, 125 + 8)  # 125 collections of 8 frames: the warm-up ends on the 125th
    assert first == 1000
    assert sum(steady) == 8 * 8 * updates_per_frame


def test_frames_past_the_warmup_in_the_burst_collection_get_the_usual_ratio() -> None:
    dm = data_module(0.5, warmup_frames=1004)  # the 126th collection ends 4 frames past the warm-up
    assert grants(dm, 126)[0] == 1004 + 2


def test_each_rank_bursts_on_its_share_of_the_warmup() -> None:
    dm = data_module(0.5, warmup_frames=1008)
    dm.world_size = 2  # the ranks collect in lockstep: frames count both ranks' collections
    first, *steady = grants(dm, 63 + 4)
    assert first == 504 and sum(steady) == 4 * 8 * 0.5


def test_without_the_burst_the_warmup_frames_grant_nothing_extra() -> None:
    dm = data_module(0.5, burst=False)
    assert grants(dm, 126) == [4, 4]
