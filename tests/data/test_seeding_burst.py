"""TD-MPC2's seeding burst (``collect.warmup_burst``): after the warm-up, one update per warm-up frame.

The reference trainer runs ``num_updates = seed_steps`` updates at the step the seeding ends and one per
step after it; the burst is not scaled by the update-to-data ratio, which only sets the steady rate.
"""

from __future__ import annotations

import pytest

from rl_lightning.data.budget import FrameBudget


def budget(updates_per_frame: float, warmup_frames: int = 1000, burst: bool = True, world_size: int = 1):
    return FrameBudget(10_000, warmup_frames, updates_per_frame, warmup_burst=burst, world_size=world_size)


def grants(b: FrameBudget, collections: int, frames_per_batch: int = 8) -> list[int]:
    """Updates granted by each collection of this rank once the warm-up is in."""
    out = []
    for _ in range(collections):
        granted = b.add(frames_per_batch)
        if b.frames >= b.warmup_frames:
            out.append(granted)
    return out


@pytest.mark.parametrize("updates_per_frame", [0.25, 0.5, 1.0, 2.0])
def test_the_burst_is_one_update_per_warmup_frame_whatever_the_ratio(updates_per_frame: float) -> None:
    b = budget(updates_per_frame)
    first, *steady = grants(b, 125 + 8)  # 125 collections of 8 frames: the warm-up ends on the 125th
    assert first == 1000
    assert sum(steady) == 8 * 8 * updates_per_frame
    assert b.owed == first + sum(steady)


def test_frames_past_the_warmup_in_the_burst_collection_get_the_usual_ratio() -> None:
    b = budget(0.5, warmup_frames=1004)  # the 126th collection ends 4 frames past the warm-up
    assert grants(b, 126)[0] == 1004 + 2


def test_each_rank_bursts_on_its_share_of_the_warmup() -> None:
    b = budget(0.5, warmup_frames=1008, world_size=2)  # frames count both ranks' collections
    first, *steady = grants(b, 63 + 4)
    assert first == 504 and sum(steady) == 4 * 8 * 0.5


def test_without_the_burst_the_warmup_frames_grant_nothing_extra() -> None:
    b = budget(0.5, burst=False)
    assert grants(b, 126) == [4, 4]
