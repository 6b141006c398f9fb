"""The replay buffer's storage: TorchRL's ``LazyTensorStorage`` with direct writes and reads of its leaves.

TorchRL's ``LazyTensorStorage`` writes a batch with ``storage[index] = data`` and reads one with
``storage[:len][index]``: TensorDict's generic indexing, which checks and broadcasts each entry, casts the
whole batch to the storage's device and builds the result through its per-key dispatch. For the small
batches of RL (one frame written per SAC step, one ``[256]`` sample read per update) that machinery costs
several times the copies themselves on a CPU.

:class:`DirectTensorStorage` is a ``LazyTensorStorage`` whose ``set`` and ``get`` copy each leaf directly
(``leaf[index] = value``, ``leaf[index]``) when the data is a plain ``TensorDict`` with exactly the
storage's keys, and each entry the dtype, device and trailing shape of its leaf, at a 1-D ``int64`` index
(or a tuple of one, as ``SliceSampler`` reads its slices):
the same copies as TorchRL's, so the same contents and samples (``tests/data/test_replay_storage.py``).
Anything else (a first write, which allocates the storage; other keys, dtypes or shapes, lazy stacks, slices,
multi-dimensional storages) goes to ``LazyTensorStorage`` unchanged. The buffer, its writer, its sampler
and its checkpoints are TorchRL's own.

Through a whole ``TensorDictReplayBuffer`` of 1M transitions on this project's 2-core CPU, a one-frame
``extend`` went from 181 to 80 us and a ``[256]`` ``sample`` from 125 to 82 us
(``benchmarks/results/replay_storage.json``).
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage

from rl_lightning.compat import (
    HAS_STORAGE_BOOKKEEPING,
    build_td,
    storage_bump_revision,
    storage_is_full,
    storage_note_write,
    storage_table,
    storage_written,
    td_entries,
)

__all__ = ["DIRECT_STORAGE", "DirectTensorStorage"]

#: What the direct path reads and updates of ``LazyTensorStorage`` (``rl_lightning.compat``'s
#: ``HAS_STORAGE_BOOKKEEPING``): the storage's TensorDict, how full it is, and the bookkeeping of a write. A
#: release without them leaves every write and read to ``LazyTensorStorage``'s own path: the same rows, the
#: speed-up lost.
DIRECT_STORAGE = HAS_STORAGE_BOOKKEEPING


def _matching_leaves(store: TensorDict, data: Any, out: list) -> bool:
    """Collects ``(leaf, value)`` pairs of ``store`` and ``data``; ``False`` where ``data`` is not a plain
    ``TensorDict`` with exactly ``store``'s keys and, per entry, its leaf's dtype, device and trailing
    shape."""
    if type(data) is not TensorDict:
        return False
    entries, values = td_entries(store), td_entries(data)
    if entries.keys() != values.keys():
        return False
    for key, leaf in entries.items():
        value = values[key]
        if type(leaf) is TensorDict:
            if not _matching_leaves(leaf, value, out):
                return False
        elif (
            type(leaf) is not torch.Tensor
            or type(value) is not torch.Tensor
            or value.dtype is not leaf.dtype
            or value.device != leaf.device
            or value.shape[1:] != leaf.shape[1:]
        ):
            return False
        else:
            out.append((leaf, value))
    return True


def _gather(store: TensorDict, index: torch.Tensor, used: int | None) -> TensorDict | None:
    """``store[:used][index]`` for a 1-D index (``used=None``: the whole store), built leaf by leaf;
    ``None`` where an entry is not a plain tensor or ``TensorDict``, or a ``TensorDict`` names its dims."""
    if any(n is not None for n in store.names):
        return None
    out = {}
    for key, leaf in td_entries(store).items():
        if type(leaf) is TensorDict:
            leaf = _gather(leaf, index, used)
            if leaf is None:
                return None
            out[key] = leaf
        elif type(leaf) is torch.Tensor:
            out[key] = (leaf if used is None else leaf.narrow(0, 0, used))[index]
        else:
            return None
    batch_size = torch.Size([*index.shape, *store.batch_size[1:]])  # a nested entry keeps its own dims
    return build_td(out, batch_size, store.device)


class DirectTensorStorage(LazyTensorStorage):
    """``LazyTensorStorage`` with direct leaf copies for plain ``TensorDict`` batches at 1-D indices.

    Args: those of ``LazyTensorStorage`` (``max_size``, ``device``, ...).
    """

    #: Take the direct path where it applies (``DIRECT_STORAGE``; a test turns it off to compare).
    direct = DIRECT_STORAGE

    def _direct(self, index: Any) -> bool:
        store = storage_table(self)
        return (
            self.direct
            and self.initialized
            and type(store) is TensorDict
            and store.batch_dims == 1
            and not getattr(self, "shared_init", False)
            and type(index) is torch.Tensor
            and index.ndim == 1
            and index.dtype is torch.int64
            and index.device == store.device
        )

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        if not (
            self._direct(cursor)
            # A plain TensorDict, so it has a batch size.
            and _matching_leaves(storage_table(self), data, pairs)
            and data.batch_size == cursor.shape
        ):
            return super().set(cursor, data, set_cursor=set_cursor)
        if set_cursor:
            storage_note_write(self, cursor, data)
        for leaf, value in pairs:
            leaf[cursor] = value
        storage_bump_revision(self)

    def get(self, index: Any) -> Any:
        # SliceSampler indexes a 1-D storage with a tuple of one tensor.
        rows = index[0] if type(index) is tuple and len(index) == 1 else index
        if self._direct(rows):
            # Indexed within the written part, as LazyTensorStorage does: a negative index counts from the
            # last written entry and one past it raises.
            used = None if storage_is_full(self) else storage_written(self)
            out = _gather(storage_table(self), rows, used)
            if out is not None:
                return out
        return super().get(index)
