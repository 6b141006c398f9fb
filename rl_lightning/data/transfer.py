"""Every host/device copy of a run's data path, through one switch.

A run on a GPU copies data between the host and the device at four places: the observations of the CPU
envs go to the policy and its actions come back, collected frames go into a replay on the GPU, samples of a
replay kept in host memory (``replay.device=cpu``: buffers larger than the device's memory) go to the
module, and new priorities go back to that replay. :class:`DeviceCopies` makes all of them, so one setting
decides how: plain copies by default, or (``non_blocking``, which the ``NonBlockingTransfer`` callback turns
on) copies from pinned host memory with ``non_blocking=True`` toward the device, which then overlap with
the device's work instead of waiting for it. Copies toward the host stay blocking: the env needs its actions
and the sampler its priorities before they go on.

Lightning's ``transfer_batch_to_device`` never sees this data: the batch Lightning moves is the experience
stream's round object, which is not a tensor.

Every copy is counted by route and kind (``counts``), which is how the tests see that the data path routes
its copies here and that the switch acts.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from tensordict import TensorDictBase

__all__ = ["DeviceCopies"]

Data = torch.Tensor | TensorDictBase


class DeviceCopies:
    """The data path's host/device copies, plain or non-blocking from pinned memory.

    Args:
        device: where the module (its policy and its updates) runs.
        replay_device: where the replay buffer keeps its rows.
        non_blocking: copies toward a CUDA device are ``non_blocking=True``.
        pin_memory: with ``non_blocking``, host sources are staged in pinned memory first (a copy from
            pageable memory cannot run asynchronously).
    """

    def __init__(
        self,
        device: torch.device,
        replay_device: torch.device,
        non_blocking: bool = False,
        pin_memory: bool = True,
    ) -> None:
        self.device = torch.device(device)
        self.replay_device = torch.device(replay_device)
        self.non_blocking = non_blocking
        self.pin_memory = pin_memory
        #: ``(route, kind)`` -> copies made: kind ``same`` (nothing to copy), ``blocking`` or
        #: ``non_blocking``.
        self.counts: Counter[tuple[str, str]] = Counter()

    def to_policy(self, td: TensorDictBase) -> TensorDictBase:
        """Observations from the envs (host) to the policy's device."""
        return self._move(td, self.device, "observations")

    def to_env(self, data: Data) -> Data:
        """What the policy wrote (actions) back to the envs on the host."""
        return self._move(data, torch.device("cpu"), "actions")

    def to_replay(self, rows: TensorDictBase) -> TensorDictBase:
        """Collected frames into the replay's device."""
        return self._move(rows, self.replay_device, "frames")

    def to_module(self, sample: TensorDictBase) -> TensorDictBase:
        """Replay samples to the module's device (a replay in host memory: issued before the updates that
        read them, so the copies of later samples overlap with the earlier updates)."""
        return self._move(sample, self.device, "samples")

    def to_sampler(self, data: Data) -> Data:
        """New priorities from the module to the replay's device."""
        return self._move(data, self.replay_device, "priorities")

    def _move(self, data: Data, device: torch.device, route: str) -> Data:
        source = _device_of(data)
        if source == device:
            self.counts[route, "same"] += 1
            return data
        if self.non_blocking and device.type == "cuda":
            self.counts[route, "non_blocking"] += 1
            pin = self.pin_memory and source is not None and source.type == "cpu"
            if isinstance(data, TensorDictBase):
                # num_threads=0: pin leaf by leaf in this thread; a pool pays off only for huge batches.
                return data.to(device, non_blocking=True, non_blocking_pin=pin, num_threads=0)
            return (data.pin_memory() if pin and not data.is_pinned() else data).to(device, non_blocking=True)
        self.counts[route, "blocking"] += 1
        return data.to(device)

    def copied(self, route: str) -> dict[str, int]:
        """``{kind: count}`` of one route's copies so far."""
        return {kind: n for (r, kind), n in self.counts.items() if r == route}


def _device_of(data: Any) -> torch.device | None:
    """The device of a tensor, or of a TensorDict (the one all its leaves share, else ``None``)."""
    if data.device is not None or not isinstance(data, TensorDictBase):
        return data.device
    devices = {leaf.device for leaf in data.values(True, True) if isinstance(leaf, torch.Tensor)}
    return devices.pop() if len(devices) == 1 else None
