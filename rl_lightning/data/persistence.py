"""Persistence: the replay buffer and each rank's random streams, saved beside a checkpoint.

The replay is written to ``<ckpt>.replay/`` by the checkpoint callback rather than into the checkpoint, so
a large buffer is not copied into every checkpoint. A data-parallel run writes one shard per rank
(``rank_<r>/``), each with the rank's own random state and episode statistics, since those differ between
ranks while the checkpoint holds rank 0's.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rl_lightning.data.safety import check_replay_dir

__all__ = ["load_replay", "rng_state", "save_replay", "set_rng_state"]


def rng_state() -> dict[str, Any]:
    """The global random states of torch (CPU and, where CUDA is initialized, every GPU's), NumPy and Python,
    as plain values (checkpoints load with ``torch.load(weights_only=True)``)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (name, keys.tolist(), int(pos), int(has_gauss), float(cached)),
        "python": random.getstate(),
    }
    # A process that never touched CUDA has drawn nothing from its generators (and reading them would
    # initialize CUDA, which a DDP parent process must not do before it forks).
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores what :func:`rng_state` returned. The GPUs' states are restored where the process sees as
    many GPUs as the saving one did (a GPU run resumed on a CPU has none to restore)."""
    torch.set_rng_state(state["torch"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
        torch.cuda.set_rng_state_all(cuda)
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


def _shard(path: Path, rank: int, world_size: int) -> Path:
    return path / f"rank_{rank}" if world_size > 1 else path


def save_replay(
    replay: Any, path: str | Path, rank: int, world_size: int, rank_state: dict[str, Any]
) -> None:
    """Writes this rank's replay shard to the directory ``path`` (atomically replaced), with ``rank_state``
    beside it in a data-parallel run."""
    target = _shard(Path(path), rank, world_size)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    replay.dumps(tmp)
    if world_size > 1:
        torch.save(rank_state, tmp / "rank_state.pt")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def load_replay(replay: Any, path: str | Path, rank: int, world_size: int) -> dict[str, Any] | None:
    """Restores this rank's shard written by :func:`save_replay` into ``replay``; returns the rank state
    saved with it (``None`` for a single process).

    Raises:
        FileNotFoundError: when the directory is missing (the checkpoint was saved without it).
        UnsafeFileError: the directory holds something loading would have to run (see
            :func:`rl_lightning.data.safety.check_replay_dir`).
        ValueError: the checkpoint was written by a different number of ranks.
    """
    path = Path(path)
    check_replay_dir(path)  # nothing of it is read before it passed
    shards = sorted(p.name for p in path.glob("rank_*") if p.is_dir())
    if len(shards) != (world_size if world_size > 1 else 0):
        written = f"{len(shards)} ranks" if shards else "one process"
        raise ValueError(
            f"{path} was written by {written}; resume it with trainer.devices={max(1, len(shards))} "
            f"(and as many nodes), not {world_size}."
        )
    shard = _shard(path, rank, world_size)
    replay.loads(shard)
    if world_size > 1:
        return torch.load(shard / "rank_state.pt", weights_only=True)
    return None
