"""Every host/device copy of a run's data path, through one switch.

A run on a GPU copies data between the host and the device at these places, each a route of
:class:`DeviceCopies` (the name its copies are counted under):

- ``observations`` / ``actions``: the CPU envs' observations to the policy and its actions back
  (``eval_observations`` / ``eval_actions`` for the evaluation envs);
- ``frames``: collected frames into a replay on the GPU (image frames into the frame store too);
- ``samples``: samples of a replay kept in host memory (``replay.device=cpu``: buffers larger than the
  device's memory) to the module; a PPO rollout to the module's device;
- ``priorities``: new priorities back to the replay (``priority_updates``: the prioritized sampler's
  own check that they are there);
- ``sample_index``: a slice sample's index, drawn on the host, to the replay's device;
- ``trajectory_ids`` / ``written_slots``: what the slice samplers and the prioritized sampler read of the
  replay's writes (ids, slots) on the host, or need of them on the replay's device;
- ``frame_serials``: the frame serials of an image sample to the frame store;
- ``checkpoint``: a replay's rollout, frames or priorities to the host for a checkpoint and back.

:class:`DeviceCopies` makes all of them, so one setting decides how: plain copies by default, or
(``non_blocking``, which the ``NonBlockingTransfer`` callback turns on) copies from pinned host memory with
``non_blocking=True`` toward the device, which then overlap with the device's work instead of waiting for
it. Copies toward the host stay blocking: the env needs its actions and the sampler its ids before they go
on. TorchRL's collectors get their device arguments from here (:meth:`DeviceCopies.collector_devices`):
their batches stay on the host and cross through ``frames``.

What does not cross here, and why (``tests/data/test_copy_routes.py`` holds the list): the copies TorchRL
makes inside its worker processes for the module's copy there (another process: the switch cannot reach
them; each worker step pays TorchRL's non-blocking copy and a synchronisation, in the worker); metrics read
back for logging (one blocking read per logging interval, a documented synchronisation); the episode
totals of a data-parallel run, which cross to the device for the collective and back (per logging
interval); weights (a module moved by Lightning, the worker's copy pickled on the host, hockey's self-play
snapshots), which are not the data path.

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
_HOST = torch.device("cpu")


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

    def to_policy(self, td: TensorDictBase, route: str = "observations") -> TensorDictBase:
        """Observations from the envs (host) to the policy's device (``route``: ``eval_observations`` for
        the evaluation envs)."""
        return self._move(td, self.device, route)

    def to_env(self, data: Data, route: str = "actions") -> Data:
        """What the policy wrote (actions) back to the envs on the host."""
        return self._move(data, _HOST, route)

    def to_replay(self, data: Data, route: str = "frames") -> Data:
        """Collected frames into the replay's device; with another ``route``, anything else the replay's
        side reads there (a sample's index drawn on the host, frame serials, a loaded checkpoint)."""
        return self._move(data, self.replay_device, route)

    def to_module(self, sample: Data, route: str = "samples") -> Data:
        """Replay samples to the module's device (a replay in host memory: issued before the updates that
        read them, so the copies of later samples overlap with the earlier updates); a loaded rollout."""
        return self._move(sample, self.device, route)

    def to_sampler(self, data: Data, route: str = "priorities") -> Data:
        """New priorities from the module to the replay's device."""
        return self._move(data, self.replay_device, route)

    def to_host(self, data: Data, route: str) -> Data:
        """What the host reads back from a device: trajectory ids and written slots for the slice samplers,
        rows for a checkpoint. Always blocking: the host reads the values next."""
        return self._move(data, _HOST, route)

    def use_non_blocking(self, enabled: bool, pin_memory: bool = True) -> None:
        """Turns the non-blocking copies on or off (``NonBlockingTransfer`` does, through the data path's
        progress view)."""
        self.non_blocking, self.pin_memory = enabled, pin_memory

    def collector_devices(self, policy_in_workers: bool) -> dict[str, torch.device]:
        """TorchRL's device arguments for a collector whose batches cross to the replay through
        :meth:`to_replay`: the envs and the stored batches on the host, and the policy on the host where it
        crosses through this switch (in this process) or has no device (Ray's actors), or on the module's
        device where it acts in TorchRL's worker processes (``policy_in_workers``). There TorchRL copies
        each step's observations and actions between the host and the device itself (non-blocking, then a
        synchronisation per step, in the worker); the switch cannot reach another process's copies.
        """
        policy = self.device if policy_in_workers else _HOST
        return {"env_device": _HOST, "storing_device": _HOST, "policy_device": policy}

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
