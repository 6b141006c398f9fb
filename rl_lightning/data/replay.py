"""Replay buffer builders over TorchRL's ``TensorDictReplayBuffer``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

from rl_lightning.data.per import TensorPrioritizedSampler

__all__ = ["ReplayConfig", "make_replay_buffer", "resolve_device"]

#: The key under which the collector writes trajectory ids (needed by sequence sampling).
TRAJ_KEY = ("collector", "traj_ids")


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> the GPU when there is one, else the CPU; ``cuda`` without a GPU is an error."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda was asked for but CUDA is not available here; use device=auto or cpu.")
    return device


@dataclass
class ReplayConfig:
    """What ``conf/replay/*.yaml`` holds; see the configuration reference."""

    capacity: int = 100_000
    batch_size: int = 64
    device: str = "auto"
    prioritized: bool = False
    alpha: float = 0.6
    beta: float = 0.4
    n_step: int = 1
    slice_len: int | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.batch_size < 1:
            raise ValueError("replay.capacity and replay.batch_size must be positive.")
        if self.n_step < 1:
            raise ValueError("replay.n_step must be >= 1 (1 means one-step TD targets).")
        if self.prioritized and self.slice_len is not None:
            raise ValueError("replay.prioritized with replay.slice_len is not supported; choose one.")


def make_replay_buffer(cfg: ReplayConfig, interleaved: bool = False) -> TensorDictReplayBuffer:
    """A ``TensorDictReplayBuffer`` over ``LazyTensorStorage`` on ``cfg.device``.

    Prioritized replay uses :class:`TensorPrioritizedSampler` (priorities read from ``td_error``);
    ``slice_len`` samples sub-trajectories of that many steps with ``SliceSampler`` (batch ``batch_size``
    counts steps, so it must be a multiple of ``slice_len``).

    Args:
        cfg: the replay config.
        interleaved: the steps of one trajectory are not adjacent in storage (several envs write one
            step each per collection). With ``slice_len`` the sampler then rebuilds trajectories from the
            traj ids and ``step_count`` (TorchRL's fragmented mode) instead of from storage adjacency.
    """
    device = resolve_device(cfg.device)
    storage = LazyTensorStorage(cfg.capacity, device=device)
    if cfg.prioritized:
        sampler = TensorPrioritizedSampler(cfg.capacity, alpha=cfg.alpha, beta=cfg.beta, device=device)
    elif cfg.slice_len is not None:
        if cfg.batch_size % cfg.slice_len:
            raise ValueError(
                f"replay.batch_size ({cfg.batch_size}) must be a multiple of "
                f"replay.slice_len ({cfg.slice_len})."
            )
        fragmented = {"fragmented": True, "step_key": "step_count"} if interleaved else {}
        sampler = SliceSampler(slice_len=cfg.slice_len, traj_key=TRAJ_KEY, strict_length=True, **fragmented)
    else:
        sampler = RandomSampler()
    return TensorDictReplayBuffer(
        storage=storage,
        sampler=sampler,
        batch_size=cfg.batch_size,
        priority_key="td_error",
    )
