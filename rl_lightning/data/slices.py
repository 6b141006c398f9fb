"""The replay's slice samplers: TorchRL's ``SliceSampler`` reading less per sample, and its fragmented mode
without a sort of the whole buffer per sample.

When several envs write one step each per collection, a trajectory's steps are not adjacent in storage, and
TorchRL's ``SliceSampler`` (``fragmented=True``) rebuilds them from the trajectory ids and step counts: its
index orders the live records by ``(trajectory, step)`` and cuts them into runs of consecutive steps. It
re-sorts every live record (two stable ``argsort`` over the buffer) on the first sample after each write,
and an update samples after every collection: with 4 envs, 6.6 ms per write and sample at 100k frames and
107 ms at 1M on this project's CPU (``benchmarks/slice_sampler.py``).

:class:`InterleavedSliceSampler` is that sampler with an index that keeps the records sorted across writes:
a write removes the overwritten records' keys from the sorted arrays and inserts the new ones
(``searchsorted`` and a copy, no sort), and the runs are cut from the sorted arrays in one vectorised pass.
The order is the one TorchRL's index computes (records sorted by ``(trajectory, step)``, which are unique),
so the runs, and the samples drawn from them with a given random state, are TorchRL's
(``tests/test_replay_slices.py``). Reading the written records, checking them, the revision protocol that
detects writes it was not told about (a full rebuild then) and the sampling itself stay TorchRL's.

Both samplers here (:class:`TrajectorySliceSampler` for adjacent steps, :class:`InterleavedSliceSampler`)
also read less per sample: TorchRL's ``SliceSampler`` gathers every stored entry of the sampled steps to
read their done, terminated and ``is_init`` flags, and the buffer then gathers the same steps again for the
sample. Here the sampler gathers only those flags, for the same sample and info: one env's step written and
a ``[256 x 3]`` sample drawn, 1.21 -> 1.14 ms at 20k frames of 8 stored entries on this project's CPU; the
saving grows with the entries stored (TD-MPC2 on hockey stores 15).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from torchrl._utils import _replace_last
from torchrl.data.replay_buffers.samplers import SliceSampler
from torchrl.data.replay_buffers.samplers._trajectory import _FragmentedTrajectoryIndex

__all__ = ["InterleavedSliceSampler", "TrajectorySliceSampler"]

#: A record's sort key is ``trajectory << _STEP_BITS | step``: both must be non-negative and fit.
_STEP_BITS = 32
_MAX_TRAJECTORY = 1 << (63 - _STEP_BITS)


#: Writes of up to this many records are merged piece by piece (one copy of the arrays); larger ones with
#: masks, whose per-element cost is higher but whose Python cost does not grow with the write.
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


class _SortedRunIndex(_FragmentedTrajectoryIndex):
    """TorchRL's fragmented trajectory index with the live records kept sorted by ``(trajectory, step)``.

    ``_sorted_keys`` / ``_sorted_slots``: the live records' keys in ascending order and their storage slots;
    ``None`` until built, and when an id does not fit a key (negative or too large trajectory ids), in which
    case :meth:`runs` is TorchRL's.
    """

    def __init__(self, trajectory_key: Any, step_key: Any) -> None:
        super().__init__(trajectory_key, step_key)
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
        live = (self._slot_step >= 0).nonzero().squeeze(-1)
        keys = self._keys(self._slot_traj[live], self._slot_step[live])
        if keys is None:
            self._sorted_keys = self._sorted_slots = None
            return
        self._sorted_keys, order = torch.sort(keys)
        self._sorted_slots = live[order]

    def _full_rebuild(self, storage: Any, revision: int) -> None:
        super()._full_rebuild(storage, revision)
        self._sort_all()

    def _apply_pending(self, storage: Any, revision: int) -> None:
        if self._sorted_keys is None or not self._pending_indices:
            return super()._apply_pending(storage, revision)
        pending = torch.cat([index.cpu().reshape(-1) for index in self._pending_indices])
        slots = torch.unique(pending[(pending >= 0) & (pending < len(storage))])
        known = slots[slots < self._slot_step.numel()]
        old_live = self._slot_step[known] >= 0
        removed = self._keys(self._slot_traj[known][old_live], self._slot_step[known][old_live])
        super()._apply_pending(storage, revision)
        if self._trajectory_positions is None:  # TorchRL's index cleared itself (and raised)
            return
        new_step = self._slot_step[slots]
        new_live = new_step >= 0
        added = self._keys(self._slot_traj[slots][new_live], new_step[new_live])
        if removed is None or added is None:
            self._sorted_keys = self._sorted_slots = None
            return
        added, order = torch.sort(added)
        self._sorted_keys, self._sorted_slots = _merge(
            self._sorted_keys, self._sorted_slots, removed, added, slots[new_live][order]
        )

    def runs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed slots, run offsets and run lengths, as TorchRL's index returns them."""
        if self._runs is not None or self._trajectory_positions is None or self._sorted_keys is None:
            return super().runs()
        keys = self._sorted_keys
        new_run = torch.ones_like(keys, dtype=torch.bool)
        if keys.numel() > 1:
            # Another trajectory or a gap in the steps: another run. Within a trajectory consecutive
            # steps have consecutive keys.
            new_run[1:] = (keys[1:] >> _STEP_BITS != keys[:-1] >> _STEP_BITS) | (keys[1:] != keys[:-1] + 1)
        run_offsets = new_run.nonzero().squeeze(-1)
        boundaries = torch.cat([run_offsets, run_offsets.new_tensor([keys.numel()])])
        device = self._device
        self._runs = (
            self._sorted_slots.to(device),
            run_offsets.to(device),
            (boundaries[1:] - boundaries[:-1]).to(device),
        )
        return self._runs


class _FlagRows:
    """``storage[index]`` as ``SliceSampler`` uses it to finish a sample, with only the ``keys`` it reads
    (those the storage holds): each a gather of one stored leaf. Any other storage or index: ``storage``'s."""

    def __init__(self, storage: Any, keys: list[Any]) -> None:
        self.storage, self.keys = storage, keys

    def __getitem__(self, index: Any) -> Any:
        store = getattr(self.storage, "_storage", None)
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


class TrajectorySliceSampler(SliceSampler):
    """TorchRL's ``SliceSampler`` that reads only the flags it needs of the sampled steps (see the module).

    Same arguments and samples as ``SliceSampler``.
    """

    def _finalize_index(self, *, storage: Any, **kwargs: Any) -> Any:
        if self.truncated_key is not None or self.init_key is not None:
            keys = [self.init_key] if self.init_key is not None else []
            if self.truncated_key is not None:
                keys += [
                    _replace_last(self.truncated_key, "done"),
                    _replace_last(self.truncated_key, "terminated"),
                ]
            storage = _FlagRows(storage, keys)
        return super()._finalize_index(storage=storage, **kwargs)


class InterleavedSliceSampler(TrajectorySliceSampler):
    """TorchRL's ``SliceSampler`` in fragmented mode (``fragmented=True`` and ``step_key`` required) whose
    trajectory index stays sorted across writes instead of being re-sorted after each one.

    Same arguments and samples as ``SliceSampler(fragmented=True, ...)``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.fragmented:
            raise ValueError("InterleavedSliceSampler is for fragmented=True; use SliceSampler otherwise.")
        self._fragmented_index = _SortedRunIndex(self.traj_key, self.step_key)
