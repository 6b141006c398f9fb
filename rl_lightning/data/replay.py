"""Replay buffer builders over TorchRL's ``TensorDictReplayBuffer``."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

from rl_lightning.algos.base import ReplayRequirements
from rl_lightning.data.per import TensorPrioritizedSampler
from rl_lightning.data.slices import FAST_SLICES, InterleavedSliceSampler, TrajectorySliceSampler
from rl_lightning.data.storage import DirectTensorStorage
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.device import resolve_device

__all__ = ["ReplayConfig", "ReplayMismatchError", "make_replay_buffer", "resolve_replay"]

#: The key under which the collector writes trajectory ids (needed by sequence sampling).
TRAJ_KEY = ("collector", "traj_ids")


class ReplayMismatchError(ValueError):
    """The replay config contradicts what the algorithm needs (its :class:`ReplayRequirements`)."""


@dataclass
class ReplayConfig:
    """What ``conf/replay/*.yaml`` holds; see the configuration reference.

    ``slice_len`` is normally left unset: it follows the algorithm (:func:`resolve_replay`).
    """

    capacity: int = 100_000
    batch_size: int = 64
    device: str = "auto"
    prioritized: bool = False
    alpha: float = 0.6
    beta: float = 0.4
    n_step: int = 1
    slice_len: int | None = None
    store_frames: bool | str = "auto"
    frame_capacity: int | None = None

    def __post_init__(self) -> None:
        if self.capacity < 1 or self.batch_size < 1:
            raise ValueError("replay.capacity and replay.batch_size must be positive.")
        if self.n_step < 1:
            raise ValueError("replay.n_step must be >= 1 (1 means one-step TD targets).")
        if self.slice_len is not None and self.slice_len < 1:
            raise ValueError(f"replay.slice_len={self.slice_len} must be >= 1 or null.")
        if self.prioritized and self.slice_len is not None:
            raise ValueError("replay.prioritized with replay.slice_len is not supported; choose one.")
        if self.store_frames not in ("auto", True, False):
            raise ValueError(f"replay.store_frames={self.store_frames!r}: use auto, true or false.")
        if self.frame_capacity is not None and self.frame_capacity < 1:
            raise ValueError(f"replay.frame_capacity={self.frame_capacity} must be positive or null.")


def resolve_replay(cfg: ReplayConfig, needs: ReplayRequirements, algo: str) -> ReplayConfig:
    """The replay config the data path uses: ``cfg`` checked against, and completed from, ``needs``.

    ``slice_len`` follows the algorithm when unset. Everything the algorithm cannot use is refused with
    one line that says what to change, never silently dropped.

    Args:
        cfg: the user's replay config.
        needs: the algorithm's :meth:`~rl_lightning.algos.base.RLModule.replay_requirements`.
        algo: the algorithm's name, for the messages.

    Raises:
        ReplayMismatchError: ``cfg`` contradicts ``needs``.
    """
    if needs.slice_len is not None:
        if cfg.slice_len is None:
            cfg = dataclasses.replace(cfg, slice_len=needs.slice_len)
        elif cfg.slice_len != needs.slice_len:
            raise ReplayMismatchError(
                f"replay.slice_len={cfg.slice_len} contradicts {algo}, which trains on sub-trajectories of "
                f"{needs.slice_len} steps (its horizon); leave replay.slice_len unset (it follows)."
            )
    elif cfg.slice_len is not None:
        raise ReplayMismatchError(
            f"replay.slice_len={cfg.slice_len}: {algo} trains on single transitions; remove replay.slice_len."
        )
    if cfg.n_step > 1 and not needs.n_step:
        raise ReplayMismatchError(
            f"replay.n_step={cfg.n_step}: {algo} does not take n-step returns; set replay.n_step=1."
        )
    if cfg.prioritized and not needs.prioritized:
        raise ReplayMismatchError(
            f"replay.prioritized=true: {algo} does not use prioritized replay; set replay.prioritized=false."
        )
    if cfg.slice_len is not None and cfg.batch_size % cfg.slice_len:
        raise ReplayMismatchError(
            f"replay.batch_size={cfg.batch_size} must be a multiple of the slice length {cfg.slice_len} "
            f"({algo} samples whole slices); for example replay.batch_size={cfg.slice_len * 32}."
        )
    return cfg


def make_replay_buffer(
    cfg: ReplayConfig, interleaved: bool = False, copies: DeviceCopies | None = None
) -> TensorDictReplayBuffer:
    """A ``TensorDictReplayBuffer`` over ``LazyTensorStorage`` (its leaves written and read directly:
    :class:`~rl_lightning.data.storage.DirectTensorStorage`) on the replay's device: ``copies.replay_device``
    (a run passes its device copies, through which the samplers make their host/device copies), or, with
    ``copies=None``, ``cfg.device`` resolved here (the samplers then copy plainly).

    Prioritized replay uses :class:`TensorPrioritizedSampler` (priorities read from ``td_error``);
    ``slice_len`` samples sub-trajectories of that many steps with ``SliceSampler`` (batch ``batch_size``
    counts steps, so it must be a multiple of ``slice_len``).

    Args:
        cfg: the replay config.
        interleaved: the steps of one trajectory are not adjacent in storage (several envs write one
            step each per collection). With ``slice_len`` the sampler then rebuilds trajectories from the
            traj ids and ``step_count`` (TorchRL's fragmented mode, with the index kept sorted across writes:
            :class:`~rl_lightning.data.slices.InterleavedSliceSampler`) instead of from storage adjacency.
    """
    device = resolve_device(cfg.device) if copies is None else copies.replay_device
    storage = DirectTensorStorage(cfg.capacity, device=device)
    if cfg.prioritized:
        sampler = TensorPrioritizedSampler(
            cfg.capacity, alpha=cfg.alpha, beta=cfg.beta, device=device, batch_size=cfg.batch_size,
            copies=copies,
        )  # fmt: skip
    elif cfg.slice_len is not None:
        if cfg.batch_size % cfg.slice_len:
            raise ValueError(
                f"replay.batch_size ({cfg.batch_size}) must be a multiple of "
                f"replay.slice_len ({cfg.slice_len})."
            )
        common = {"slice_len": cfg.slice_len, "traj_key": TRAJ_KEY, "strict_length": True}
        if interleaved:
            common.update(fragmented=True, step_key="step_count")
        if FAST_SLICES:
            cls = InterleavedSliceSampler if interleaved else TrajectorySliceSampler
            sampler = cls(**common, copies=copies)
        else:  # TorchRL without the hooks: its own sampler, whose copies are its own (out of the switch)
            sampler = SliceSampler(**common)
    else:
        sampler = RandomSampler()
    return TensorDictReplayBuffer(
        storage=storage,
        sampler=sampler,
        batch_size=cfg.batch_size,
        priority_key="td_error",
    )
