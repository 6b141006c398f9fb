"""The slice samplers: TrajectorySliceSampler (TorchRL's SliceSampler reading only the flags it needs) and
InterleavedSliceSampler (its fragmented mode with an index kept sorted across writes).

Each test writes the same data into a buffer with TorchRL's sampler and one with ours, and checks that the
index's runs and the samples drawn with the same random state are equal, through overwrites of a full
ring buffer, episode ends, empty writes, a checkpoint round trip and ids that do not fit a sort key.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler

from rl_lightning.data import slices
from rl_lightning.data.replay import TRAJ_KEY, ReplayConfig, make_replay_buffer
from rl_lightning.data.slices import InterleavedSliceSampler, TrajectorySliceSampler
from rl_lightning.data.storage import DirectTensorStorage
from rl_lightning.data.transfer import DeviceCopies


class _Envs:
    """``num_envs`` envs stepping together; episodes of random lengths, one trajectory id per episode."""

    def __init__(self, num_envs: int, seed: int, first_id: int = 0) -> None:
        self.gen = torch.Generator().manual_seed(seed)
        self.num_envs = num_envs
        self.next_id = first_id + num_envs
        self.traj = torch.arange(first_id, first_id + num_envs)
        self.step = torch.zeros(num_envs, dtype=torch.int64)

    def rows(self, steps: int) -> TensorDict:
        """``[num_envs * steps]`` rows, env-major, as the data module writes a ``[num_envs, T]`` batch."""
        traj = torch.empty(self.num_envs, steps, dtype=torch.int64)
        step = torch.empty_like(traj)
        done = torch.empty(self.num_envs, steps, dtype=torch.bool)
        for t in range(steps):
            traj[:, t], step[:, t] = self.traj, self.step
            done[:, t] = torch.rand(self.num_envs, generator=self.gen) < 0.15
            for e in done[:, t].nonzero().flatten().tolist():
                self.traj[e], self.step[e] = self.next_id, -1
                self.next_id += 1
            self.step += 1
        n = self.num_envs * steps
        return TensorDict(
            {
                "observation": torch.randn(n, 3, generator=self.gen),
                "step_count": step.reshape(n, 1),
                "collector": {"traj_ids": traj.reshape(n)},
                "next": {"done": done.reshape(n, 1), "terminated": done.reshape(n, 1)},
            },
            [n],
        )


def _buffer(
    sampler_cls: type,
    capacity: int,
    slice_len: int = 3,
    batch: int = 12,
    fragmented: bool = True,
    **kwargs: Any,
) -> TensorDictReplayBuffer:
    mode = {"fragmented": True, "step_key": "step_count"} if fragmented else {}
    sampler = sampler_cls(slice_len=slice_len, traj_key=TRAJ_KEY, strict_length=True, **mode, **kwargs)
    return TensorDictReplayBuffer(storage=DirectTensorStorage(capacity), sampler=sampler, batch_size=batch)


def _assert_same(stock: TensorDictReplayBuffer, ours: TensorDictReplayBuffer, seed: int) -> None:
    torch.manual_seed(seed)
    expected, expected_info = stock.sample(return_info=True)
    torch.manual_seed(seed)
    got, info = ours.sample(return_info=True)
    if stock.sampler.fragmented:
        runs = stock.sampler._fragmented_index.runs(), ours.sampler._fragmented_index.runs()
        for a, b in zip(*runs, strict=True):
            assert torch.equal(a, b)
    assert expected_info.keys() == info.keys()
    for key, value in expected_info.items():  # the index (a tuple of tensors) and the flags
        pairs = zip(value, info[key], strict=True) if isinstance(value, tuple) else [(value, info[key])]
        for a, b in pairs:
            assert torch.equal(a, b)
    assert set(expected.keys(True, True)) == set(got.keys(True, True))
    assert (expected == got).all()


@pytest.mark.parametrize(
    ("num_envs", "max_steps", "capacity"),
    [(1, 4, 40), (3, 4, 40), (8, 30, 300)],  # the last: writes large enough for the masked merge
)
def test_samples_equal_torchrl_fragmented_sampler_through_overwrites(
    num_envs: int, max_steps: int, capacity: int
) -> None:
    stock, ours = _buffer(SliceSampler, capacity), _buffer(InterleavedSliceSampler, capacity)
    envs = _Envs(num_envs, seed=num_envs)
    gen = torch.Generator().manual_seed(7)
    for i in range(60):  # several times the capacity: every slot is overwritten several times
        rows = envs.rows(int(torch.randint(1, max_steps + 1, (1,), generator=gen)))
        stock.extend(rows)
        ours.extend(rows)
        _assert_same(stock, ours, seed=i)
    assert ours.sampler._fragmented_index._sorted_keys is not None  # the incremental path was the one used


def test_samples_equal_after_a_checkpoint_round_trip_and_empty() -> None:
    stock, ours = _buffer(SliceSampler, 30), _buffer(InterleavedSliceSampler, 30)
    envs = _Envs(2, seed=3)
    for _ in range(12):
        rows = envs.rows(2)
        stock.extend(rows)
        ours.extend(rows)
    state = ours.state_dict()
    restored = _buffer(InterleavedSliceSampler, 30)
    restored.load_state_dict(state)
    _assert_same(stock, restored, seed=1)
    for _ in range(5):  # writes after the restore go through the incremental path again
        rows = envs.rows(3)
        stock.extend(rows)
        restored.extend(rows)
        _assert_same(stock, restored, seed=2)
    stock.empty()
    ours.empty()
    rows = envs.rows(4)
    stock.extend(rows)
    ours.extend(rows)
    _assert_same(stock, ours, seed=3)


def test_ids_that_do_not_fit_a_key_use_torchrl_runs() -> None:
    stock, ours = _buffer(SliceSampler, 30), _buffer(InterleavedSliceSampler, 30)
    envs = _Envs(2, seed=5, first_id=1 << 40)
    for i in range(8):
        rows = envs.rows(4)
        stock.extend(rows)
        ours.extend(rows)
        _assert_same(stock, ours, seed=i)
    assert ours.sampler._fragmented_index._sorted_keys is None


def test_replay_of_interleaved_envs_uses_it() -> None:
    cfg = ReplayConfig(capacity=100, batch_size=6, slice_len=3, device="cpu")
    assert type(make_replay_buffer(cfg, interleaved=True).sampler) is InterleavedSliceSampler
    assert type(make_replay_buffer(cfg).sampler) is TrajectorySliceSampler
    with pytest.raises(ValueError, match="fragmented=True"):
        InterleavedSliceSampler(slice_len=3, traj_key=TRAJ_KEY)


@pytest.mark.parametrize("is_init", [False, True])
def test_adjacent_steps_sample_as_torchrl_slice_sampler(is_init: bool) -> None:
    """One env's steps, adjacent in storage: the same samples and info (done, terminated, truncated and,
    when stored, is_init marking each slice's start) through the ring buffer's overwrites."""
    stock = _buffer(SliceSampler, 40, fragmented=False)
    ours = _buffer(TrajectorySliceSampler, 40, fragmented=False)
    envs = _Envs(1, seed=11)
    for i in range(40):
        rows = envs.rows(3)
        if is_init:
            rows.set("is_init", rows.get("step_count") == 0)
        stock.extend(rows)
        ours.extend(rows)
        if i >= 2:
            _assert_same(stock, ours, seed=i)
    if is_init:
        assert "is_init" in ours.sample().keys()


def _stock_ends(buffer: TensorDictReplayBuffer) -> tuple[torch.Tensor, ...]:
    """TorchRL's trajectory boundaries of ``buffer``'s storage: a pass over every stored id."""
    return SliceSampler._get_stop_and_length(buffer.sampler, buffer.storage)


def _assert_ends(buffer: TensorDictReplayBuffer) -> None:
    got, expected = buffer.sampler._get_stop_and_length(buffer.storage), _stock_ends(buffer)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


def _one_trajectory(traj_id: int, steps: int) -> TensorDict:
    """``steps`` rows of one trajectory that does not end."""
    return TensorDict(
        {
            "observation": torch.randn(steps, 3),
            "step_count": torch.arange(steps).unsqueeze(-1),
            "collector": {"traj_ids": torch.full((steps,), traj_id)},
            "next": {
                "done": torch.zeros(steps, 1, dtype=torch.bool),
                "terminated": torch.zeros(steps, 1, dtype=torch.bool),
            },
        },
        [steps],
    )


@pytest.mark.parametrize("capacity", [37, 64, 300])
def test_adjacent_trajectory_ends_kept_across_writes_equal_torchrl(capacity: int, monkeypatch) -> None:
    """One env: the ends kept across writes are TorchRL's from a pass over the buffer after every write
    (filling, at capacity with the last written slot marked, overwrites across the ring's end, several
    writes between samples, small and large writes), and only the first sample reads the whole buffer."""
    rebuilds = []
    rebuild = slices._AdjacentEnds._rebuild
    monkeypatch.setattr(
        slices._AdjacentEnds, "_rebuild", lambda self, *a: rebuilds.append(1) or rebuild(self, *a)
    )
    ours = _buffer(TrajectorySliceSampler, capacity, fragmented=False)
    envs = _Envs(1, seed=capacity)
    gen = torch.Generator().manual_seed(1)
    ours.extend(envs.rows(5))
    for i in range(80):  # several times the capacity
        for _ in range(int(torch.randint(1, 4, (1,), generator=gen))):
            ours.extend(envs.rows(int(torch.randint(1, 9, (1,), generator=gen))))
        if i % 10 == 9:  # a large write (over 64 rows with the largest capacity)
            ours.extend(envs.rows(capacity * 2 // 5))
        _assert_ends(ours)
    assert ours.storage._is_full and len(rebuilds) == 1
    for steps in (capacity - 1, 1, 2):  # one trajectory over the whole ring: only the cursor marks an end
        ours.extend(_one_trajectory(10_000, steps))
        _assert_ends(ours)
    assert len(rebuilds) == 1


def test_adjacent_trajectory_ends_rebuilt_after_other_changes(monkeypatch) -> None:
    """Changes the sampler is not told about, a backlog of writes, a copy, a checkpoint and ``empty()``:
    the ends are rebuilt from the buffer and still TorchRL's."""
    ours = _buffer(TrajectorySliceSampler, 50, fragmented=False)
    envs = _Envs(1, seed=4)
    ours.extend(envs.rows(30))
    _assert_ends(ours)
    # Trajectory ids rewritten in place (no write through the sampler): the revision tells.
    ids = ours.storage._storage.get(TRAJ_KEY)
    ours.set_at_(TRAJ_KEY, ids[:30].flip(0).clone(), torch.arange(30))
    _assert_ends(ours)
    ours.storage.set(torch.arange(3, 6), envs.rows(3), set_cursor=False)  # a direct storage write
    _assert_ends(ours)
    monkeypatch.setattr(slices, "_REBUILD_ROWS", 16)
    for _ in range(6):  # 18 rows before the next sample
        ours.extend(envs.rows(3))
    assert ours.sampler._ends._ends is None
    _assert_ends(ours)
    copy = pickle.loads(pickle.dumps(ours.sampler))
    assert copy._ends._ends is None
    restored = _buffer(TrajectorySliceSampler, 50, fragmented=False)
    restored.load_state_dict(ours.state_dict())
    _assert_ends(restored)
    restored.extend(envs.rows(4))
    _assert_ends(restored)
    ours.empty()
    ours.extend(envs.rows(7))
    _assert_ends(ours)


def test_adjacent_trajectory_ends_without_ids_use_torchrl() -> None:
    """A storage without the trajectory ids: TorchRL's reconstruction from the done flags."""
    ours = _buffer(TrajectorySliceSampler, 40, fragmented=False)
    rows = _Envs(1, seed=2).rows(25)
    rows.exclude(TRAJ_KEY, inplace=True)
    del rows["collector"]
    ours.extend(rows)
    lengths = ours.sampler._get_stop_and_length(ours.storage)[2]
    assert lengths.sum() == 25 and ours.sampler._ends._ends is None
    _assert_ends(ours)


def test_an_index_drawn_on_the_host_goes_to_the_storage_device(monkeypatch) -> None:
    """With the storage on a GPU, the slices are drawn on the host and only the finished index is copied
    over, once per sample, through the run's device copies (route ``sample_index``). Here the storage says
    it is on a GPU until the copy, which is recorded instead (its data stays on the CPU): the draw sees host
    tensors, every sample's index goes through the copy, and the samples stay TorchRL's."""
    copies: list[torch.Tensor] = []

    class Recorded(DeviceCopies):
        def to_replay(self, data: torch.Tensor, route: str = "frames") -> torch.Tensor:
            if route != "sample_index":
                return super().to_replay(data, route)
            assert data.device.type == "cpu"
            copies.append(data)
            ours.storage.device = torch.device("cpu")  # what follows the copy reads the data where it is
            return data

    cpu = torch.device("cpu")
    stock = _buffer(SliceSampler, 40, fragmented=False)
    ours = _buffer(TrajectorySliceSampler, 40, fragmented=False, copies=Recorded(cpu, cpu))
    draws = []
    sample_slices = ours.sampler._sample_slices
    monkeypatch.setattr(
        ours.sampler,
        "_sample_slices",
        lambda lengths, *a, **k: draws.append(lengths) or sample_slices(lengths, *a, **k),
    )
    envs = _Envs(1, seed=6)
    for i in range(20):
        rows = envs.rows(3)
        stock.extend(rows)
        ours.extend(rows)
        if i >= 2:
            ours.storage.device = torch.device("cuda")
            _assert_same(stock, ours, seed=i)
    assert len(copies) == len(draws) == 18
    assert all(c.shape == (12, 1) for c in copies) and all(d.device.type == "cpu" for d in draws)


@pytest.mark.gpu
@pytest.mark.parametrize("num_envs", [1, 8])
def test_gpu_replay_samples_as_on_the_cpu_without_waiting_for_the_device(num_envs: int) -> None:
    """A replay on the GPU draws its slices' index on the host and copies it over asynchronously (the run's
    device copies with ``non_blocking``): its samples equal the same replay's on the CPU for the same random
    state, and once the first sample after a write has read the written trajectory ids, sampling never makes
    the host wait for the device (CUDA's sync debug mode raises at any synchronisation), so it runs while
    the previous update does. The control: with the switch off the same sample does wait."""
    replays = [
        make_replay_buffer(
            ReplayConfig(capacity=300, batch_size=12, slice_len=3, device=d),
            interleaved=num_envs > 1,
            copies=DeviceCopies(torch.device(d), torch.device(d), non_blocking=d == "cuda"),
        )
        for d in ("cpu", "cuda")
    ]
    envs = _Envs(num_envs, seed=4)
    for i in range(40):  # past the capacity: overwrites
        rows = envs.rows(3)
        for replay in replays:
            replay.extend(rows.to(replay.storage.device))
        for j in range(3):
            torch.manual_seed(3 * i + j)
            expected, expected_info = replays[0].sample(return_info=True)
            torch.manual_seed(3 * i + j)
            if j:
                torch.cuda.set_sync_debug_mode("error")
            try:
                got, info = replays[1].sample(return_info=True)
            finally:
                torch.cuda.set_sync_debug_mode("default")
            assert got.device.type == "cuda"
            assert (expected == got.cpu()).all()
            for key, value in expected_info.items():
                pairs = (
                    zip(value, info[key], strict=True) if isinstance(value, tuple) else [(value, info[key])]
                )
                for a, b in pairs:
                    assert b.device.type == "cuda" and torch.equal(a, b.cpu())
    copies = replays[1].sampler._copies.get(replays[1].storage)
    assert copies.counts["sample_index", "non_blocking"] >= 80
    copies.use_non_blocking(False)  # the control: a plain index copy waits for the device
    replays[1].sample()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            replays[1].sample()
    finally:
        torch.cuda.set_sync_debug_mode("default")
