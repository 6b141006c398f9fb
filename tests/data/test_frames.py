"""The frame store: each frame stored once; stacks rebuilt at sampling equal the stacks the envs returned."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler

from rl_lightning.data.frames import FrameReplay, FrameStore, stores_frames
from rl_lightning.data.ingest import rows
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.per import TensorPrioritizedSampler
from rl_lightning.data.replay import ReplayConfig, make_replay_buffer
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.factory import EnvConfig, make_env

pytest.importorskip("ale_py")
pytest.importorskip("minatar")

#: Atari with episodes cut at 25 steps (truncations) and MinAtar Breakout, whose random episodes end by
#: termination within a few dozen steps: both cross many episode ends in a few hundred steps.
ATARI = EnvConfig(id="ALE/Pong-v5", preprocess="atari", frame_stack=4, max_episode_steps=25, num_envs=2)
MINATAR = EnvConfig(id="MinAtar/Breakout-v1", preprocess="minatar", num_envs=3)
CPU = torch.device("cpu")


def collected(cfg: EnvConfig, steps: int, frames_per_batch: int, seed: int = 0) -> list[TensorDict]:
    """Random-policy batches ``[num_envs, T]`` from the real collector over the real envs."""
    env = make_env(cfg, seed=seed, train=True)
    collector = Collector(
        env, None, frames_per_batch=frames_per_batch, total_frames=steps * cfg.num_envs, storing_device="cpu"
    )
    try:
        return [b.clone() for b in collector]
    finally:
        collector.shutdown()


def fill(
    cfg: EnvConfig,
    batches: list[TensorDict],
    capacity: int,
    n_step: int = 1,
    frame_capacity: int | None = None,
    **kwargs,
) -> tuple:
    """The same batches into a plain replay (whole observations) and a frame replay, row for row."""
    keys = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated"))
    keys += ("steps_to_next_obs",) if n_step > 1 else ()
    frame_keys = ("obs_frames", ("next", "obs_frames"), *keys[1:2], *keys[3:])
    plain = make_replay_buffer(ReplayConfig(capacity=capacity, batch_size=16, device="cpu"))
    spec = make_env(cfg, num_envs=1).observation_spec["observation"]
    frames = FrameReplay(
        make_replay_buffer(ReplayConfig(capacity=capacity, batch_size=16, device="cpu", **kwargs)),
        tuple(spec.shape[1:]),
        cfg.frame_stack,
        DeviceCopies(CPU, CPU),
        frame_capacity,
    )
    steps = [NStepReturns(n_step, 0.99) if n_step > 1 else None for _ in range(2)]
    for batch in batches:
        a, b = batch.clone(), frames.index(batch.clone())
        if n_step > 1:
            a, b = steps[0](a), steps[1](b)
        plain.extend(rows(a, keys))
        frames.extend(rows(b, frame_keys))
    return plain, frames


@pytest.mark.parametrize("cfg", [ATARI, MINATAR], ids=["atari", "minatar"])
@pytest.mark.parametrize("n_step", [1, 3])
def test_rebuilt_stacks_equal_the_stacks_the_env_returned_across_episode_ends(cfg, n_step):
    batches = collected(cfg, steps=240, frames_per_batch=3 * cfg.num_envs)
    ends = sum(int(b.get(("next", "done")).sum()) for b in batches)
    assert ends >= 6, "the check must cross episode ends"
    plain, frames = fill(cfg, batches, capacity=10_000, n_step=n_step)
    assert len(plain) == len(frames) > 0
    sample = frames.sample(512)
    index = sample.get("index")
    expected = plain.storage[index]
    for key in ("observation", ("next", "observation"), ("next", "reward"), "action"):
        assert torch.equal(sample.get(key), expected.get(key)), key
    assert sample.get("observation").dtype == torch.uint8
    # Every row, not only a sample: the whole storage decoded equals the plain one.
    everything = frames.sample(len(frames))
    assert torch.equal(everything.get("observation"), plain.storage[everything.get("index")]["observation"])


def test_an_atari_transition_costs_about_one_frame():
    batches = collected(ATARI, steps=120, frames_per_batch=8)
    capacity = 4096
    plain, frames = fill(ATARI, batches, capacity=capacity)
    frame_bytes = 84 * 84
    row_bytes = sum(
        v.element_size() * v[0].numel() for v in frames.buffer.storage._storage.values(True, True)
    )
    per_transition = frames.store.frames.nbytes / capacity + row_bytes
    assert per_transition <= 1.15 * frame_bytes, per_transition  # not the 8 frames a naive row holds
    naive = sum(v.element_size() * v[0].numel() for v in plain.storage._storage.values(True, True))
    assert naive >= 8 * frame_bytes
    assert frames.store.frames.dtype == torch.uint8


def test_rows_whose_first_frames_left_a_small_store_are_drawn_again():
    # 3 envs, episodes of a few steps: an episode start every few transitions, more than the default 10%
    # margin can hold, in a store of barely more frames than transitions.
    batches = collected(MINATAR, steps=400, frames_per_batch=3)
    capacity = 300
    plain, frames = fill(MINATAR, batches, capacity=capacity, frame_capacity=capacity + 5)
    assert frames.may_hold_stale_rows()
    stale = frames.buffer.storage._storage.get("obs_frames").min(-1).values < frames.store.oldest
    assert stale.any(), "the test needs stale rows"
    sample = frames.sample(2048)
    assert not stale[sample.get("index")].any()
    assert torch.equal(sample.get("observation"), plain.storage[sample.get("index")]["observation"])


def test_a_roomy_store_skips_the_check():
    batches = collected(ATARI, steps=60, frames_per_batch=8)
    _, frames = fill(ATARI, batches, capacity=100)
    assert not frames.may_hold_stale_rows()


def test_prioritized_samples_keep_their_weights_and_frames():
    batches = collected(MINATAR, steps=100, frames_per_batch=6)
    plain, frames = fill(MINATAR, batches, capacity=1000, prioritized=True)
    assert isinstance(frames.sampler, TensorPrioritizedSampler)
    sample = frames.sample(64)
    assert "priority_weight" in sample.keys()
    assert torch.equal(sample.get("observation"), plain.storage[sample.get("index")]["observation"])
    frames.update_priority(sample.get("index"), torch.full((64,), 5.0))


def test_the_frames_round_trip_through_a_checkpoint(tmp_path):
    *batches, following = collected(ATARI, steps=84, frames_per_batch=8)
    _, frames = fill(ATARI, batches, capacity=500, frame_capacity=20_000)
    frames.dumps(tmp_path / "replay")
    # The frames written, not the whole allocated ring (20k frames, 141 MB).
    assert (tmp_path / "replay" / "frames.pt").stat().st_size < 1.1 * frames.store.written * 84 * 84
    _, restored = fill(ATARI, [], capacity=500, frame_capacity=20_000)
    restored.loads(tmp_path / "replay")
    assert restored.store.written == frames.store.written and len(restored) == len(frames)
    torch.manual_seed(0)
    before = frames.sample(256)
    torch.manual_seed(0)
    after = restored.sample(256)
    assert torch.equal(before.get("index"), after.get("index"))
    assert (before == after).all()
    # Every frame written, not the ring's unwritten slots (torch.empty: whatever memory held before).
    held = torch.arange(frames.store.oldest, frames.store.written)
    assert torch.equal(restored.store.get(held), frames.store.get(held))
    # The envs' current stacks came back too: the next batch, whose episodes go on (a resumed run's envs
    # continue theirs), gets the stacks it would have got without the round trip.
    assert not (following.get("step_count")[:, 0] == 0).any()
    ours, theirs = restored.index(following.clone()), frames.index(following.clone())
    assert torch.equal(ours.get("obs_frames"), theirs.get("obs_frames"))


def test_the_store_keeps_the_last_capacity_frames_in_a_ring():
    store = FrameStore(5, (1, 2), CPU, torch.uint8)
    store.add(torch.arange(4, dtype=torch.uint8).view(4, 1, 1).expand(4, 1, 2))
    store.add(torch.arange(4, 7, dtype=torch.uint8).view(3, 1, 1).expand(3, 1, 2))  # wraps
    assert store.written == 7 and store.oldest == 2
    assert store.get(torch.tensor([2, 6, 4])).flatten(1)[:, 0].tolist() == [2, 6, 4]


def test_auto_stores_frames_for_images_sampled_as_transitions():
    images = make_env(MINATAR, num_envs=1).observation_spec["observation"]
    vectors = make_env(EnvConfig(id="CartPole-v1"), num_envs=1).observation_spec["observation"]
    assert stores_frames("auto", images, None)
    assert not stores_frames("auto", images, 3)  # sub-trajectories keep whole observations
    assert not stores_frames("auto", vectors, None)
    assert not stores_frames(False, images, None)
    with pytest.raises(ValueError, match="store_frames=false"):
        stores_frames(True, images, 3)


@pytest.mark.gpu
def test_a_gpu_replay_rebuilds_its_stacks_on_the_gpu():
    cuda = torch.device("cuda")
    batches = collected(ATARI, steps=60, frames_per_batch=8)
    plain, _ = fill(ATARI, batches, capacity=1000)
    spec = make_env(ATARI, num_envs=1).observation_spec["observation"]
    copies = DeviceCopies(cuda, cuda)
    frames = FrameReplay(
        TensorDictReplayBuffer(storage=make_replay_buffer(ReplayConfig(capacity=1000, device="cuda")).storage,
                               sampler=RandomSampler(), batch_size=16),
        tuple(spec.shape[1:]), 4, copies,
    )  # fmt: skip
    keys = ("obs_frames", "action", ("next", "obs_frames"), ("next", "reward"), ("next", "terminated"))
    for batch in batches:
        frames.extend(copies.to_replay(rows(frames.index(batch.clone()), keys)))
    assert frames.store.frames.device.type == "cuda"
    sample = frames.sample(64)
    assert sample.get("observation").device.type == "cuda"
    assert torch.equal(
        sample.get("observation").cpu(), plain.storage[sample.get("index").cpu()]["observation"]
    )
