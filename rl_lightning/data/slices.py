"""The replay's slice samplers: TorchRL's ``SliceSampler`` reading less per sample, without a pass over the
whole buffer per sample for one env's trajectories, and its fragmented mode without a sort of the whole
buffer per sample.

When several envs write one step each per collection, a trajectory's steps are not adjacent in storage, and
TorchRL's ``SliceSampler`` (``fragmented=True``) rebuilds them from the trajectory ids and step counts: its
index orders the live records by ``(trajectory, step)`` and cuts them into runs of consecutive steps. It
re-sorts every live record (two stable ``argsort`` over the buffer) on the first sample after each write,
and an update samples after every collection: with 4 envs, 9.8 ms per write and sample at 100k frames and
85 ms at 1M on this project's CPU (``benchmarks/results/slice_sampler.json``; 1.9 and 8.2 ms with the
sampler below).

:class:`InterleavedSliceSampler` is that sampler with an index that keeps the records sorted across writes:
a write removes the overwritten records' keys from the sorted arrays and inserts the new ones
(``searchsorted`` and a copy, no sort), and the runs are cut from the sorted arrays in one vectorised pass.
The order is the one TorchRL's index computes (records sorted by ``(trajectory, step)``, which are unique),
so the runs, and the samples drawn from them with a given random state, are TorchRL's
(``tests/data/test_replay_slices.py``). Reading the written records, checking them, the revision protocol that
detects writes it was not told about (a full rebuild then) and the sampling itself stay TorchRL's.

Both samplers here (:class:`TrajectorySliceSampler` for adjacent steps, :class:`InterleavedSliceSampler`)
also read less per sample: TorchRL's ``SliceSampler`` gathers every stored entry of the sampled steps to
read their done, terminated and ``is_init`` flags, and the buffer then gathers the same steps again for the
sample. Here the sampler gathers only those flags, for the same sample and info: one env's step written and
a ``[256 x 3]`` sample drawn, 1.21 -> 1.14 ms at 20k frames of 8 stored entries on this project's CPU (before
the trajectory ends below were kept); the saving grows with the entries stored (TD-MPC2 on hockey stores 15).

With one env a trajectory is a run of adjacent slots, and TorchRL's ``SliceSampler`` finds the runs' ends
from every stored trajectory id on each sample: time in proportion to the fill, 4.4 ms per write and
``[256 x 3]`` sample at 1M frames, 1.2 ms with the ends kept. :class:`TrajectorySliceSampler` keeps them
across writes (``_AdjacentEnds``): a write can only change them at and just before its slots, so a sample
after a write reads a few ids and updates a sorted array of the ends, one per trajectory. The ends, and so
the samples, are TorchRL's (``tests/data/test_replay_slices.py`` compares them after every write);
anything the sampler was not told about rebuilds them from the buffer.

On a GPU storage both samplers draw a sample on the host: the ends and runs stay on the CPU, TorchRL's draw
runs there on them (with the CPU's generator, so the samples are those of the same replay on the CPU), and
the finished index goes to the device in one copy through the run's device copies (route
``sample_index``): with ``non_blocking`` on, from pinned memory without waiting for the device. Drawn on the
device, the draw's checks and masks read device tensors, and each read waits for the work queued before it,
a CUDA-graphed update included; drawn on the host with non-blocking copies, the next sample is prepared
while the device runs that update (with plain copies the index's copy waits for that update). Only the
first sample after a write reads the device: the written trajectory ids (routes ``trajectory_ids`` and
``written_slots``, blocking: the host reads them next).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data.replay_buffers.storages import TensorStorage

from rl_lightning.compat import (
    HAS_SLICE_HOOKS,
    FragmentedIndexHooks,
    SliceSamplerHooks,
    storage_is_full,
    storage_last_cursor,
    storage_revision,
    storage_table,
)
from rl_lightning.data.transfer import DeviceCopies

__all__ = ["FAST_SLICES", "InterleavedSliceSampler", "TrajectorySliceSampler"]

#: Whether TorchRL has what these samplers build on (``rl_lightning.compat.HAS_SLICE_HOOKS``): its slice
#: sampler's steps, its fragmented index and the storage's write bookkeeping. Without it the replay samples
#: with TorchRL's ``SliceSampler`` itself (``rl_lightning.data.replay``): the same slices, drawn more slowly.
FAST_SLICES = HAS_SLICE_HOOKS

#: A record's sort key is ``trajectory << _STEP_BITS | step``: both must be non-negative and fit.
_STEP_BITS = 32
_MAX_TRAJECTORY = 1 << (63 - _STEP_BITS)


#: Writes since the last sample beyond this many rows rebuild the trajectory ends from the whole buffer.
_REBUILD_ROWS = 1 << 16


#: Writes of up to this many records are merged piece by piece (one copy of the arrays), and their slots
#: listed in Python for one env's trajectory ends; larger ones with masks, whose per-element cost is higher
#: but whose Python cost does not grow with the write.
_PIECEWISE_MAX = 64


def _merge(
    keys: torch.Tensor,
    slots: torch.Tensor,
    removed: torch.Tensor,
    added: torch.Tensor,
    added_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``keys`` (sorted, with their ``slots``) without the keys ``removed`` (all present) and with the
    sorted keys ``added`` (and their ``added_slots``), still sorted."""
    drop = torch.searchsorted(keys, removed)
    at = torch.searchsorted(keys, added)  # positions in ``keys`` before which the added keys go
    if drop.numel() + at.numel() <= _PIECEWISE_MAX:
        # Walk the positions once: each piece of ``keys`` between two of them is copied once, by ``cat``.
        events = sorted([(p, 0, j) for j, p in enumerate(at.tolist())] + [(p, 1, -1) for p in drop.tolist()])
        key_parts, slot_parts, start = [], [], 0
        for position, is_drop, j in events:
            key_parts.append(keys[start:position])
            slot_parts.append(slots[start:position])
            if is_drop:
                start = position + 1
            else:
                key_parts.append(added[j : j + 1])
                slot_parts.append(added_slots[j : j + 1])
                start = position
        key_parts.append(keys[start:])
        slot_parts.append(slots[start:])
        return torch.cat(key_parts), torch.cat(slot_parts)
    keep = torch.ones_like(keys, dtype=torch.bool)
    keep[drop] = False
    keys, slots = keys[keep], slots[keep]
    # The j-th added key lands after the kept keys below it and the j added keys before it.
    at = torch.searchsorted(keys, added) + torch.arange(added.numel())
    total = keys.numel() + added.numel()
    old_place = torch.ones(total, dtype=torch.bool)
    old_place[at] = False
    merged_keys, merged_slots = keys.new_empty(total), slots.new_empty(total)
    merged_keys[old_place], merged_keys[at] = keys, added
    merged_slots[old_place], merged_slots[at] = slots, added_slots
    return merged_keys, merged_slots


def _replace_last(key: Any, new_end: str) -> Any:
    """``key`` with its last name replaced: ``("next", "truncated")`` -> ``("next", "done")``."""
    return new_end if isinstance(key, str) else (*key[:-1], new_end)


class _SortedRunIndex(FragmentedIndexHooks):
    """TorchRL's fragmented trajectory index with the live records kept sorted by ``(trajectory, step)``.

    ``_sorted_keys`` / ``_sorted_slots``: the live records' keys in ascending order and their storage slots;
    ``None`` until built, and when an id does not fit a key (negative or too large trajectory ids), in which
    case :meth:`runs` is TorchRL's. ``copies``: the sampler's device copies (the written slots come to the
    host through them).
    """

    def __init__(self, trajectory_key: Any, step_key: Any, copies: _HostCopies) -> None:
        super().__init__(trajectory_key, step_key)
        self._copies = copies
        self._sorted_keys: torch.Tensor | None = None
        self._sorted_slots: torch.Tensor | None = None

    def clear(self) -> None:
        super().clear()
        self._sorted_keys = self._sorted_slots = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_sorted_keys"] = state["_sorted_slots"] = None
        return state

    @staticmethod
    def _keys(trajectory: torch.Tensor, step: torch.Tensor) -> torch.Tensor | None:
        """``trajectory << _STEP_BITS | step``; ``None`` when an id does not fit."""
        if trajectory.numel():
            low, high = int(trajectory.min()), int(trajectory.max())
            if low < 0 or high >= _MAX_TRAJECTORY or int(step.max()) >> _STEP_BITS:
                return None
        return (trajectory << _STEP_BITS) | step

    def _sort_all(self) -> None:
        live = (self.slot_steps >= 0).nonzero().squeeze(-1)
        keys = self._keys(self.slot_trajectories[live], self.slot_steps[live])
        if keys is None:
            self._sorted_keys = self._sorted_slots = None
            return
        self._sorted_keys, order = torch.sort(keys)
        self._sorted_slots = live[order]

    def after_rebuild(self) -> None:
        self._sort_all()

    def before_pending(self, storage: Any) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The written slots and the keys of the live records they held (``None``: nothing to merge)."""
        if self._sorted_keys is None or not self.pending_writes:
            return None
        to_host = self._copies.get(storage).to_host
        pending = torch.cat([to_host(index, "written_slots").reshape(-1) for index in self.pending_writes])
        slots = torch.unique(pending[(pending >= 0) & (pending < len(storage))])
        known = slots[slots < self.slot_steps.numel()]
        old_live = self.slot_steps[known] >= 0
        return slots, self._keys(self.slot_trajectories[known][old_live], self.slot_steps[known][old_live])

    def after_pending(self, state: tuple[torch.Tensor, torch.Tensor | None] | None) -> None:
        if state is None or not self.built:  # nothing to merge, or TorchRL's index cleared itself
            return
        slots, removed = state
        new_step = self.slot_steps[slots]
        new_live = new_step >= 0
        added = self._keys(self.slot_trajectories[slots][new_live], new_step[new_live])
        if removed is None or added is None:
            self._sorted_keys = self._sorted_slots = None
            return
        added, order = torch.sort(added)
        self._sorted_keys, self._sorted_slots = _merge(
            self._sorted_keys, self._sorted_slots, removed, added, slots[new_live][order]
        )

    def runs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed slots, run offsets and run lengths, as TorchRL's index returns them."""
        if self.cached_runs is not None or not self.built or self._sorted_keys is None:
            return super().runs()
        keys = self._sorted_keys
        new_run = torch.ones_like(keys, dtype=torch.bool)
        if keys.numel() > 1:
            # Another trajectory or a gap in the steps: another run. Within a trajectory consecutive
            # steps have consecutive keys.
            new_run[1:] = (keys[1:] >> _STEP_BITS != keys[:-1] >> _STEP_BITS) | (keys[1:] != keys[:-1] + 1)
        run_offsets = new_run.nonzero().squeeze(-1)
        boundaries = torch.cat([run_offsets, run_offsets.new_tensor([keys.numel()])])
        # Kept on the host, whatever the storage's device: the sample's index is drawn from them there
        # (see ``TrajectorySliceSampler``).
        self.cached_runs = self._sorted_slots, run_offsets, boundaries[1:] - boundaries[:-1]
        return self.cached_runs


def _present(keys: torch.Tensor, queries: torch.Tensor) -> torch.Tensor:
    """Which of ``queries`` the sorted ``keys`` hold: a binary search each (``torch.isin`` sorts ``keys``)."""
    at = torch.searchsorted(keys, queries).clamp_max(max(keys.numel() - 1, 0))
    return keys[at] == queries if keys.numel() else torch.zeros_like(queries, dtype=torch.bool)


class _AdjacentEnds:
    """The trajectory ends of a 1-D storage whose trajectories are runs of adjacent slots (one env), kept
    across writes: what TorchRL's ``SliceSampler`` derives from every stored trajectory id per sample.

    TorchRL marks slot ``i`` as a trajectory's last step when the trajectory id changes between ``i`` and
    the next slot (the next one modulo the length once the buffer is full; the last written slot always,
    while it is not), plus, in a full buffer, the slot written last; a buffer without any mark gets one on
    its last slot. Only the first rule reads the ids, and a write changes it only at the written slots and
    the slots just before them. ``_ends`` keeps those positions sorted (on the CPU); a sample after writes
    reads the ids at and after the affected positions, removes and inserts what changed, and adds the other
    rules' marks. The writer's notification of each write (``mark_update``) carries the storage's mutation
    revision after it; a revision without one (``update_``, ``loads``, ``empty()``, a write through another
    path), a new storage or a large backlog of writes rebuilds the positions from the whole buffer. The ids
    it reads cross to the host through ``copies`` (route ``trajectory_ids``).
    """

    def __init__(self, copies: _HostCopies) -> None:
        self._copies = copies
        self.clear()

    def clear(self) -> None:
        self._ends: torch.Tensor | None = None
        self._storage_ref: weakref.ref | None = None
        self._revision = -1
        self._pending: list[tuple[int, torch.Tensor]] = []  # (storage revision after the write, slots)
        self._pending_rows = 0

    def mark_update(self, index: Any, storage: Any) -> None:
        """The buffer wrote the slots ``index`` of ``storage`` (its writer's notice, after the write)."""
        if storage is None or self._ends is None or self._storage_ref() is not storage:
            self._ends = None
            return
        index = torch.as_tensor(index).reshape(-1)
        self._pending_rows += index.numel()
        if self._pending_rows > _REBUILD_ROWS:
            self._ends = None  # a rebuild costs less than the backlog
            self._pending.clear()
            return
        self._pending.append((storage_revision(storage), index))

    def boundaries(self, storage: Any, key: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(start [K, 1], stop [K, 1], lengths [K])`` as TorchRL's ``_get_stop_and_length`` returns them
        for trajectory ids under ``key``, on the CPU whatever the storage's device; ``None`` where the ids are
        not one plain 1-D stored tensor."""
        store = storage_table(storage)
        leaf = store.get(key, None) if type(store) is TensorDict and store.batch_dims == 1 else None
        length = len(storage)
        if type(leaf) is not torch.Tensor or leaf.ndim != 1 or length == 0:
            return None
        full = storage_is_full(storage)
        revision = storage_revision(storage)
        known = self._ends is not None and self._storage_ref() is storage
        pending = [(r, index) for r, index in self._pending if r > self._revision]
        copies = self._copies.get(storage)
        if not known or {r for r, _ in pending} != set(range(self._revision + 1, revision + 1)):
            self._rebuild(leaf, length, full, copies)
        elif pending:
            self._apply(leaf, length, full, torch.cat([index for _, index in pending]), copies)
        self._storage_ref, self._revision = weakref.ref(storage), revision
        self._pending.clear()
        self._pending_rows = 0
        ends = self._ends
        if not full:
            ends = torch.cat([ends, ends.new_tensor([length - 1])])
        else:
            cursor = storage_last_cursor(storage)
            if cursor is not None:
                cursor = ends.new_tensor([int(cursor)])
                if not _present(ends, cursor).item():
                    ends = _merge(ends, ends, ends[:0], cursor, cursor)[0]
            if not ends.numel():
                ends = ends.new_tensor([length - 1])
        # Each trajectory starts after the previous one's end, the first after the last one's (a ring).
        first, last = int(ends[0]), int(ends[-1])
        start = torch.roll(ends, 1).add_(1)
        start[0] = (last + 1) % length
        lengths = (ends - start).add_(1)
        lengths[0] = (first - last - 1) % length + 1  # the only one that can wrap around
        return start.unsqueeze(-1), ends.unsqueeze(-1), lengths

    def _rebuild(self, leaf: torch.Tensor, length: int, full: bool, copies: DeviceCopies) -> None:
        ids = leaf[:length]
        ends = (ids[:-1] != ids[1:]).nonzero().squeeze(-1)
        if full and length > 1:
            ends = torch.cat([ends, (ids[-1:] != ids[:1]).nonzero().squeeze(-1) + length - 1])
        self._ends = copies.to_host(ends, "trajectory_ids")

    def _apply(
        self, leaf: torch.Tensor, length: int, full: bool, written: torch.Tensor, copies: DeviceCopies
    ) -> None:
        # The pairs (i, next of i) whose ids a write can have changed: at and just before each written slot.
        if written.numel() <= _PIECEWISE_MAX:  # one env's usual write: a few slots, in Python
            slots = [w for w in written.tolist() if 0 <= w < length]
            near = {p % length for w in slots for p in (w - 1, w)}
            pairs = torch.tensor(
                sorted(near if full else {p for p in near if p <= length - 2}), dtype=torch.int64
            )
        else:
            written = copies.to_host(written, "written_slots")
            written = written[(written >= 0) & (written < length)]
            pairs = torch.cat([written - 1, written])
            pairs = torch.unique(pairs % length if full else pairs[(pairs >= 0) & (pairs <= length - 2)])
        if not pairs.numel():
            return
        at = copies.to_replay(torch.cat([pairs, (pairs + 1) % length]), "trajectory_ids")
        ids = copies.to_host(leaf[at], "trajectory_ids")
        added = pairs[ids[: pairs.numel()] != ids[pairs.numel() :]]
        removed = pairs[_present(self._ends, pairs)]
        self._ends = _merge(self._ends, self._ends, removed, added, added)[0]


class _HostCopies:
    """A sampler's device copies: the run's (``copies``, handed in by the data module), or, for a replay
    built outside a run, plain copies of its own toward its storage's device."""

    def __init__(self, copies: DeviceCopies | None) -> None:
        self.copies = copies

    def get(self, storage: Any) -> DeviceCopies:
        if self.copies is None:
            device = getattr(storage, "device", None)  # None or "auto": no device (yet)
            device = torch.device("cpu") if device is None or device == "auto" else torch.device(device)
            self.copies = DeviceCopies(device, device)
        return self.copies


class _FlagRows:
    """``storage[index]`` as ``SliceSampler`` uses it to finish a sample, with only the ``keys`` it reads
    (those the storage holds): each a gather of one stored leaf. Any other storage or index: ``storage``'s."""

    def __init__(self, storage: Any, keys: list[Any]) -> None:
        self.storage, self.keys = storage, keys

    def __getitem__(self, index: Any) -> Any:
        store = storage_table(self.storage)
        if not (
            type(store) is TensorDict
            and store.batch_dims == 1
            and type(index) is tuple
            and len(index) == 1
            and type(index[0]) is torch.Tensor
            and index[0].ndim == 1
        ):
            return self.storage[index]
        rows = index[0]
        # A sampler's indices lie in the written part, where the whole leaf and the written part agree.
        leaves = {key: store.get(key, None) for key in self.keys}
        out = TensorDict({}, batch_size=rows.shape, device=store.device)
        for key, leaf in leaves.items():
            if type(leaf) is torch.Tensor:
                out.set(key, leaf[rows])
            elif leaf is not None:  # a nested TensorDict or another entry: the storage's own read
                return self.storage[index]
        return out


class TrajectorySliceSampler(SliceSamplerHooks):
    """TorchRL's ``SliceSampler`` that reads only the flags it needs of the sampled steps and, for
    trajectory ids in a 1-D storage, keeps the trajectories' ends across writes (see the module).

    Same arguments and samples as ``SliceSampler``, and ``copies``: the run's device copies, through which
    a sample's index drawn on the host goes to a GPU storage and the ids read from it come back (``None``:
    plain copies; a replay outside a run).
    """

    def __init__(self, *args: Any, copies: DeviceCopies | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._copies = _HostCopies(copies)
        self._ends = _AdjacentEnds(self._copies)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        # A copy or another process rebuilds the ends from its storage.
        state["_ends"] = _AdjacentEnds(state["_copies"])
        return state

    def mark_update(self, index: Any, *, storage: Any = None) -> None:
        super().mark_update(index, storage=storage)
        if not self.fragmented:
            self._ends.mark_update(index, storage)

    def on_stream_end(self) -> None:
        # A patch of the stream's last steps, not told as a write: rebuild. ``empty()`` and a checkpoint
        # load change the storage's revision, which rebuilds as well.
        self._ends.clear()

    def trajectory_bounds(self, storage: Any) -> Any:
        if self.reads_stored_trajectory_ids and isinstance(storage, TensorStorage) and storage.ndim == 1:
            return self._ends.boundaries(storage, self.used_trajectory_key)
        return None

    def before_finalize(self, storage: Any, index: torch.Tensor, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        device = getattr(storage, "device", None)  # None or "auto": no device (yet)
        device = None if device is None or device == "auto" else torch.device(device)
        if device is not None and device.type != "cpu" and index.device.type == "cpu":
            # Drawn on the host (the trajectories' ends and runs are kept there): the index and what else
            # is per row go to the storage's device in one copy each (asynchronous with non_blocking); the
            # flag reads, the truncation marks and the sample's gather are then queued on the device behind
            # its work.
            copies = self._copies.get(storage)
            index = copies.to_replay(index, "sample_index")
            for key in ("seq_length", "mask_flat"):
                value = kwargs.get(key)
                if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                    kwargs[key] = copies.to_replay(value, "sample_index")
        if self.truncated_key is not None or self.init_key is not None:
            keys = [self.init_key] if self.init_key is not None else []
            if self.truncated_key is not None:
                keys += [
                    _replace_last(self.truncated_key, "done"),
                    _replace_last(self.truncated_key, "terminated"),
                ]
            storage = _FlagRows(storage, keys)
        return storage, index


class InterleavedSliceSampler(TrajectorySliceSampler):
    """TorchRL's ``SliceSampler`` in fragmented mode (``fragmented=True`` and ``step_key`` required) whose
    trajectory index stays sorted across writes instead of being re-sorted after each one.

    Same arguments and samples as ``SliceSampler(fragmented=True, ...)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.fragmented:
            raise ValueError("InterleavedSliceSampler is for fragmented=True; use SliceSampler otherwise.")
        self.set_fragmented_index(_SortedRunIndex(self.traj_key, self.step_key, self._copies))
