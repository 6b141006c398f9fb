"""Prioritized experience replay as a pure-tensor TorchRL sampler.

TorchRL's ``PrioritizedSampler`` keeps its sum tree in a compiled C++ extension that is built for one torch
release (it does not load on the torch 2.11 of the GPU image nor on 2.13), and lives on the host: with the
replay buffer on a GPU every sample and priority update would cross to the CPU. This sampler keeps the
priorities in tensors on the replay buffer's device, never synchronizes the host, and samples in two levels:
the ``capacity`` priorities are viewed as blocks of ``~sqrt(capacity / batch_size)``; a block is drawn by its
sum, then a transition within the block by its priority (``searchsorted`` over cumulative sums), so a batch
costs ``O(sqrt(capacity * batch_size))`` instead of the ``O(capacity)`` of one ``multinomial`` over all of
them. Block sums and minimums are recomputed exactly for the blocks a write touches (no drift).
Measured against TorchRL's on the same batches: ``benchmarks/results/per_sampler_*.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

from rl_lightning.compat import sampler_generator
from rl_lightning.data.transfer import DeviceCopies

__all__ = ["TensorPrioritizedSampler"]


class TensorPrioritizedSampler(Sampler):
    """Proportional prioritized sampling (Schaul et al. 2016).

    Each stored transition ``i`` has priority ``p_i = (|td_error_i| + eps) ** alpha`` (new transitions get
    the largest priority seen so far) and is drawn with probability ``p_i / sum(p)``. The importance
    weight ``(p_i / min(p)) ** -beta`` is returned as ``priority_weight`` (the key TorchRL losses read).

    Args:
        capacity: the storage capacity.
        alpha: priority exponent (0: uniform).
        beta: importance-sampling exponent.
        eps: added to every priority so none is zero.
        device: where the priorities live (the storage's device).
        batch_size: the batch usually sampled; it sets the block size (the cost is lowest at
            ``sqrt(capacity / batch_size)``).
        copies: the run's device copies, through which written slots, priorities and a loaded checkpoint
            reach ``device`` (``None``: plain copies of its own; a replay outside a run).
    """

    def __init__(
        self,
        capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-6,
        device: torch.device | str = "cpu",
        batch_size: int = 256,
        copies: DeviceCopies | None = None,
    ) -> None:
        if alpha < 0 or beta < 0:
            raise ValueError("replay.alpha and replay.beta must be >= 0.")
        self.capacity = capacity
        self.alpha = alpha
        self.beta = beta
        self.eps = eps
        self.device = torch.device(device)
        self.copies = DeviceCopies(self.device, self.device) if copies is None else copies
        self.block = max(1, round(math.sqrt(capacity / max(1, batch_size))))
        self.n_blocks = -(-capacity // self.block)
        # Padded to whole blocks; unused slots (and the padding) keep priority 0, so they are never drawn.
        self._priority = torch.zeros(self.n_blocks * self.block, device=self.device)
        self._block_sum = torch.zeros(self.n_blocks, device=self.device)
        self._block_min = torch.full((self.n_blocks,), math.inf, device=self.device)
        self._max_priority = torch.ones((), device=self.device)

    def _transform(self, priority: torch.Tensor) -> torch.Tensor:
        return (priority.abs() + self.eps) ** self.alpha

    def _write(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """Sets priorities (already transformed) and refreshes the sums and minimums of their blocks."""
        self._priority[index] = value
        blocks = index // self.block
        rows = self._priority.view(self.n_blocks, self.block)[blocks]  # [B, block]
        self._block_sum[blocks] = rows.sum(-1)
        self._block_min[blocks] = torch.where(rows > 0, rows, math.inf).amin(-1)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if len(storage) == 0:
            raise RuntimeError("Cannot sample from an empty replay buffer.")
        sums = self._block_sum.cumsum(0)
        u = torch.rand(batch_size, device=self.device, generator=sampler_generator(self)) * sums[-1]
        block = torch.searchsorted(sums, u, right=True).clamp(max=self.n_blocks - 1)
        u = u - (sums[block] - self._block_sum[block])  # the draw's position inside its block
        within = self._priority.view(self.n_blocks, self.block)[block].cumsum(-1)  # [B, block]
        offset = torch.searchsorted(within, u.unsqueeze(-1), right=True).squeeze(-1).clamp(max=self.block - 1)
        index = block * self.block + offset
        weight = (self._priority[index] / self._block_min.amin()) ** (-self.beta)
        return index, {"priority_weight": weight}

    def extend(self, index: torch.Tensor) -> None:
        index = self.copies.to_sampler(torch.as_tensor(index), "written_slots").reshape(-1)
        self._write(index, self._transform(self._max_priority).expand(index.shape))

    def add(self, index: int) -> None:
        self.extend(torch.as_tensor([index]))

    def update_priority(
        self, index: int | torch.Tensor, priority: float | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        # In a run both arrive on the replay's device already (the stream sends them through the device
        # copies, route "priorities"): these count as "same".
        index = self.copies.to_sampler(torch.as_tensor(index), "priority_updates").reshape(-1)
        priority = torch.as_tensor(priority, dtype=torch.float32)
        priority = self.copies.to_sampler(priority, "priority_updates").detach().reshape(-1)
        priority = priority.expand_as(index) if priority.numel() == 1 else priority
        self._write(index, self._transform(priority))
        self._max_priority = torch.maximum(self._max_priority, priority.abs().max())

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        self.update_priority(index, self._max_priority)

    @property
    def default_priority(self) -> torch.Tensor:
        return self._max_priority

    def state_dict(self) -> dict[str, Any]:
        priority = self._priority[: self.capacity].clone()
        return {"priority": priority, "max_priority": self._max_priority.clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._priority.zero_()
        self._priority[: self.capacity].copy_(self.copies.to_sampler(state_dict["priority"], "checkpoint"))
        rows = self._priority.view(self.n_blocks, self.block)
        self._block_sum.copy_(rows.sum(-1))
        self._block_min.copy_(torch.where(rows > 0, rows, math.inf).amin(-1))
        self._max_priority.copy_(self.copies.to_sampler(state_dict["max_priority"], "checkpoint"))

    def _empty(self) -> None:
        self._priority.zero_()
        self._block_sum.zero_()
        self._block_min.fill_(math.inf)
        self._max_priority.fill_(1.0)

    def dumps(self, path: str | Path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "priorities.pt")
        (path / "sampler.json").write_text(
            json.dumps({"alpha": self.alpha, "beta": self.beta, "eps": self.eps})
        )

    def loads(self, path: str | Path) -> None:
        state = torch.load(Path(path) / "priorities.pt", map_location=self.device, weights_only=True)
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, alpha={self.alpha}, beta={self.beta})"
