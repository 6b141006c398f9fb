"""The frame budget on its own, without a Trainer: counting, grants, trimming, warm-up, its state, the
marks of the schedule.

The seeding burst has its own file (``tests/data/test_seeding_burst.py``).
"""

from __future__ import annotations

import pytest

from rl_lightning.data.budget import FrameBudget, Mark


def test_frames_grant_updates_by_the_ratio_once_the_warmup_is_in() -> None:
    b = FrameBudget(total_frames=100, warmup_frames=20, updates_per_frame=0.5)
    # The third collection ends the warm-up: its 8 frames grant 4 updates (the warm-up's own grant none).
    assert [b.add(8) for _ in range(3)] == [0, 0, 4]
    assert b.owed == 4 and b.frames == 24
    assert b.add(3) == 1 and b.add(3) == 2  # 1.5 then 1.5: the credit carries the half over
    for _ in range(7):
        b.take_update()
    assert (b.owed, b.updates) == (0, 7)


def test_a_collection_is_trimmed_to_end_at_the_total() -> None:
    b = FrameBudget(total_frames=50, warmup_frames=0)
    b.add(40)
    assert b.frames_left() == 10
    assert b.steps_to_keep(steps=16, num_envs=1) == 10
    assert b.steps_to_keep(steps=4, num_envs=4) == 3  # 12 frames: the next multiple of the envs
    assert b.steps_to_keep(steps=2, num_envs=4) == 2  # fits
    b.add(10)
    assert b.spent and b.frames_left() == 0


def test_ranks_count_each_others_frames_and_share_the_budget() -> None:
    b = FrameBudget(total_frames=100, warmup_frames=40, world_size=2)
    assert b.random_frames_left(frames_per_batch=8) == 24  # this rank's 20, in whole collections
    b.add(10)  # both ranks collected 10
    assert b.frames == 20 and b.frames_left() == 40 and b.random_frames_left(8) == 16


@pytest.mark.parametrize("burst", [False, True])
def test_the_state_round_trips_and_goes_on_as_the_uninterrupted_budget(burst: bool) -> None:
    def fresh() -> FrameBudget:
        return FrameBudget(1000, warmup_frames=30, updates_per_frame=0.3, warmup_burst=burst)

    whole, first = fresh(), fresh()
    for b in (whole, first):
        for _ in range(7):
            b.add(7)
        b.take_update()
    resumed = fresh()
    resumed.load_state_dict(first.state_dict())
    assert [whole.add(7) for _ in range(9)] == [resumed.add(7) for _ in range(9)]
    assert whole.state_dict() == resumed.state_dict()
    assert set(whole.state_dict()) == {"frames", "updates", "owed_updates", "update_credit", "burst_done"}


# ------------------------------------------------------------------------------------------ the schedule
def test_registered_marks_come_due_at_their_frames_and_updates() -> None:
    b = FrameBudget(total_frames=1000, warmup_frames=0)
    evaluation, log = Mark("frames", every=100), Mark("updates", every=30)
    b.register_mark(evaluation)
    b.register_mark(evaluation)  # once is enough: registering again changes nothing
    b.register_mark(log)
    assert len(b.marks) == 2
    b.add(99)
    assert not b.due(evaluation) and not b.batch_end_due()
    b.add(1)
    assert b.due(evaluation) and b.batch_end_due()
    evaluation.last = b.frames  # the owner acted: due again 100 frames later
    assert not b.batch_end_due()
    for _ in range(29):
        b.take_update()
    assert not b.batch_end_due()
    b.take_update()
    assert b.due(log) and b.batch_end_due()
    log.last = b.updates
    b.add(99)
    assert not b.batch_end_due()
    b.add(1)
    assert b.due(evaluation) and not b.due(log)


def test_a_mark_every_zero_is_always_due_and_every_inf_never() -> None:
    b = FrameBudget(total_frames=10)
    never, always = Mark("frames"), Mark("updates", every=0)
    b.register_mark(never)
    b.add(5)
    assert not b.due(never) and not b.batch_end_due()
    b.add(5)
    assert b.batch_end_due(), "a spent budget ends the batch, marks or not"
    b.register_mark(always)
    assert b.due(always)
    with pytest.raises(ValueError, match="unit='steps'"):
        Mark("steps", every=1)
