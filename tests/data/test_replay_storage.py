"""DirectTensorStorage: the contents, samples and checkpoints of TorchRL's LazyTensorStorage."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

from rl_lightning.data.per import TensorPrioritizedSampler
from rl_lightning.data.replay import ReplayConfig, make_replay_buffer
from rl_lightning.data.storage import DirectTensorStorage


def frames(n: int, seed: int, traj: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(n, 3, generator=g),
            "plan": TensorDict({"actions": torch.randn(n, 4, 2, generator=g)}, [n, 4]),  # more batch dims
            "action": torch.randint(0, 5, (n,), generator=g),
            "step_count": torch.arange(n).unsqueeze(-1),
            "collector": {"traj_ids": torch.full((n,), traj)},
            "next": {
                "observation": torch.randn(n, 3, generator=g),
                "reward": torch.randn(n, 1, generator=g),
                "terminated": torch.rand(n, 1, generator=g) < 0.1,
            },
        },
        batch_size=[n],
    )


def buffers(size: int, sampler=RandomSampler, **kwargs) -> tuple[TensorDictReplayBuffer, ...]:
    return tuple(
        TensorDictReplayBuffer(
            storage=cls(size), sampler=sampler(**kwargs), batch_size=8, priority_key="td_error"
        )
        for cls in (LazyTensorStorage, DirectTensorStorage)
    )


def written(rb: TensorDictReplayBuffer) -> TensorDict:
    """The written part of the storage (the rest is uninitialized memory)."""
    return rb.storage._storage[: len(rb)]


def assert_same(a: TensorDict, b: TensorDict) -> None:
    assert a.batch_size == b.batch_size and a.device == b.device
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True):
        if isinstance(a.get(key), TensorDict):
            assert a.get(key).batch_size == b.get(key).batch_size, key
    for key in a.keys(True, True):
        assert a.get(key).dtype == b.get(key).dtype
        torch.testing.assert_close(a.get(key), b.get(key), rtol=0, atol=0)


def refuse_lazy_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("LazyTensorStorage's path taken")

    monkeypatch.setattr(LazyTensorStorage, "set", refuse)
    monkeypatch.setattr(LazyTensorStorage, "get", refuse)


def test_the_shipped_buffer_uses_it():
    assert type(make_replay_buffer(ReplayConfig(capacity=10, batch_size=2)).storage) is DirectTensorStorage


def test_writes_and_samples_equal_lazy_tensor_storage_through_wraparound():
    lazy, direct = buffers(50)
    for step in range(40):  # one-frame and several-frame writes, past the capacity (non-contiguous indices)
        batch = frames(1 + step % 4, seed=step)
        lazy.extend(batch.clone())
        direct.extend(batch.clone())
        assert len(lazy) == len(direct) and lazy._writer._cursor == direct._writer._cursor
        assert_same(written(lazy), written(direct))
        torch.manual_seed(step)
        a = lazy.sample()
        torch.manual_seed(step)
        assert_same(a, direct.sample())
    assert len(direct) == 50


def test_reads_inside_the_written_part_as_lazy_tensor_storage_does():
    lazy, direct = buffers(100)
    for rb in (lazy, direct):
        rb.extend(frames(10, seed=0))
    for index in ([0, 9, 3], [-1, -10]):  # negative indices count from the last written entry
        i = torch.tensor(index)
        assert_same(lazy.storage.get(i), direct.storage.get(i))
    for rb in (lazy, direct):  # past the written part: an error, not the storage's unwritten zeros
        with pytest.raises(IndexError):
            rb.storage.get(torch.tensor([10]))


@pytest.mark.parametrize(
    "change",
    [
        lambda td: td.exclude(("next", "reward")),  # a key missing: the storage's entry stays as it was
        lambda td: td.set("action", td.get("action").int()),  # another dtype: TorchRL casts it
        lambda td: td.set("extra", torch.ones(td.shape[0])),  # a new key
    ],
    ids=["missing-key", "other-dtype", "new-key"],
)
def test_other_data_takes_lazy_tensor_storages_path(change):
    lazy, direct = buffers(20)
    for rb in (lazy, direct):
        rb.extend(frames(4, seed=0))
    outcomes = []
    for rb in (lazy, direct):
        new = change(frames(2, seed=1))
        try:
            rb.extend(new)
            # What the new rows lack stays uninitialized memory there: compared where written.
            outcomes.append(written(rb).select(*new.keys(True, True), strict=False))
        except Exception as err:  # the same failure, if any
            outcomes.append(type(err))
    if isinstance(outcomes[0], type):
        assert outcomes[0] is outcomes[1]
    else:
        assert_same(*outcomes)


@pytest.mark.parametrize("kind", ["prioritized", "slices"])
def test_other_samplers_draw_the_same_samples(kind):
    if kind == "prioritized":
        lazy, direct = buffers(64, TensorPrioritizedSampler, capacity=64, alpha=0.6, beta=0.4)
    else:
        lazy, direct = buffers(64, SliceSampler, slice_len=4, traj_key=("collector", "traj_ids"))
    for i in range(6):
        batch = frames(8, seed=i, traj=i)
        for rb in (lazy, direct):
            rb.extend(batch.clone())
    for step in range(5):
        torch.manual_seed(step)
        a = lazy.sample()
        torch.manual_seed(step)
        b = direct.sample()
        assert_same(a, b)
        if kind == "prioritized":
            for rb, s in ((lazy, a), (direct, b)):
                rb.update_priority(s.get("index"), s.get(("next", "reward")).abs().squeeze(-1) + 0.1)


def test_a_saved_buffer_loads_and_keeps_writing_and_reading(tmp_path, monkeypatch):
    _, direct = buffers(30)
    direct.extend(frames(25, seed=0))
    direct.dumps(tmp_path / "rb")
    lazy, loaded = buffers(30)
    lazy.loads(tmp_path / "rb")
    loaded.loads(tmp_path / "rb")
    for step in range(10):  # wraps around the capacity
        batch = frames(1, seed=100 + step)
        lazy.extend(batch.clone())
        loaded.extend(batch.clone())
    assert_same(written(lazy), written(loaded))
    torch.manual_seed(0)
    a = lazy.sample()
    torch.manual_seed(0)
    assert_same(a, loaded.sample())
    refuse_lazy_paths(monkeypatch)  # the loaded storage holds plain tensors: still the direct path
    loaded.extend(frames(1, seed=200))
    loaded.sample()


def test_one_frame_writes_and_reads_take_the_direct_path(monkeypatch):
    _, direct = buffers(100)
    direct.extend(frames(5, seed=0))  # the first write allocates the storage (LazyTensorStorage's path)

    refuse_lazy_paths(monkeypatch)
    direct.extend(frames(1, seed=1))
    assert direct.sample().batch_size == torch.Size([8])


def test_slice_samples_read_through_the_direct_path(monkeypatch):
    # SliceSampler indexes the storage with a tuple of one index tensor, for its own read and the buffer's.
    _, direct = buffers(64, SliceSampler, slice_len=4, traj_key=("collector", "traj_ids"))
    for i in range(4):
        direct.extend(frames(8, seed=i, traj=i))
    lazy_get = LazyTensorStorage.get

    def get(self, index):  # the sampler's whole-storage view (``storage[:]``) stays LazyTensorStorage's
        if not isinstance(index, slice):
            raise AssertionError("LazyTensorStorage's path taken")
        return lazy_get(self, index)

    monkeypatch.setattr(LazyTensorStorage, "get", get)
    assert direct.sample().batch_size == torch.Size([8])


def test_a_list_of_tensordicts_is_written_as_lazy_tensor_storage_writes_it():
    lazy, direct = buffers(20)
    for rb in (lazy, direct):
        rb.extend(frames(4, seed=0))
        new = frames(2, seed=1).exclude("plan")  # the list is stacked: entries with one batch dim
        rb.storage.set(
            torch.tensor([4, 5]),
            [new[0].update({"index": torch.tensor(4)}), new[1].update({"index": torch.tensor(5)})],
        )
    assert_same(written(lazy).exclude("plan"), written(direct).exclude("plan"))  # the rest was written
