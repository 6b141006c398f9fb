"""Prioritized experience replay as a pure-tensor TorchRL sampler.

TorchRL's ``PrioritizedSampler`` relies on the compiled segment trees of its C++ extension, which is built
against one torch release; with another (the CPU torch 2.13 we pin) the extension does not load and the
sampler cannot be built. This sampler keeps the priorities in one tensor on the replay buffer's device and
samples with ``torch.multinomial``: O(capacity) per batch, which on a GPU is one kernel and on a CPU costs
about a millisecond for 100k transitions, and it never synchronizes the host.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage

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
    """

    def __init__(
        self, capacity: int, alpha: float, beta: float, eps: float = 1e-6, device: torch.device | str = "cpu"
    ) -> None:
        if alpha < 0 or beta < 0:
            raise ValueError("replay.alpha and replay.beta must be >= 0.")
        self.capacity = capacity
        self.alpha = alpha
        self.beta = beta
        self.eps = eps
        self.device = torch.device(device)
        self._priority = torch.zeros(capacity, device=self.device)
        self._max_priority = torch.ones((), device=self.device)

    def _transform(self, priority: torch.Tensor) -> torch.Tensor:
        return (priority.abs() + self.eps) ** self.alpha

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        n = len(storage)
        if n == 0:
            raise RuntimeError("Cannot sample from an empty replay buffer.")
        prio = self._priority[:n]
        index = torch.multinomial(prio, batch_size, replacement=True, generator=self._rng)
        weight = (prio[index] / prio.min()) ** (-self.beta)
        return index, {"priority_weight": weight}

    def extend(self, index: torch.Tensor) -> None:
        index = torch.as_tensor(index, device=self.device).reshape(-1)
        self._priority[index] = self._transform(self._max_priority)

    def add(self, index: int) -> None:
        self.extend(torch.as_tensor([index]))

    def update_priority(
        self, index: int | torch.Tensor, priority: float | torch.Tensor, *, storage: Storage | None = None
    ) -> None:
        index = torch.as_tensor(index, device=self.device).reshape(-1)
        priority = torch.as_tensor(priority, device=self.device, dtype=torch.float32).detach().reshape(-1)
        priority = priority.expand_as(index) if priority.numel() == 1 else priority
        self._priority[index] = self._transform(priority)
        self._max_priority = torch.maximum(self._max_priority, priority.abs().max())

    def mark_update(self, index: int | torch.Tensor, *, storage: Storage | None = None) -> None:
        self.update_priority(index, self._max_priority)

    @property
    def default_priority(self) -> torch.Tensor:
        return self._max_priority

    def state_dict(self) -> dict[str, Any]:
        return {"priority": self._priority.clone(), "max_priority": self._max_priority.clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._priority.copy_(state_dict["priority"])
        self._max_priority.copy_(state_dict["max_priority"])

    def _empty(self) -> None:
        self._priority.zero_()
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
