"""Loading a checkpoint, its stored config and its replay buffer without running code from the files.

A checkpoint file is a pickle; a stored config names ``_target_`` callables that Hydra instantiates; a
replay directory holds TorchRL's metadata, and TorchRL reads one file of it with ``pickle.load``. Each is
a way for a shared file to run code on the machine that loads it. So:

- checkpoints load with ``torch.load(weights_only=True)`` (tensors and plain containers only; everything
  ``fit`` writes is made of those), here and on Lightning's resume path;
- every ``_target_`` of a stored config must name one of the project's algorithms (an ``RLModule`` under
  ``rl_lightning.algos``) or one of its callbacks (a Lightning ``Callback`` under ``callbacks``), checked by
  name before anything is imported;
- a replay directory may hold only memory-mapped tensors, JSON metadata naming plain TensorDicts, tensors
  saved with ``torch.save`` (loaded with ``weights_only=True``), and pickles whose opcodes build plain
  values only (no global lookups, so nothing can be called).

Anything else is refused with :class:`UnsafeFileError`, one line that says what was found and what to do,
before any of it is loaded.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from rl_lightning.data.safety import UnsafeFileError, check_replay_dir

__all__ = [
    "CONFIG_KEY",
    "FORMAT_VERSION",
    "NotACheckpointError",
    "UnsafeFileError",
    "check_replay_dir",
    "check_targets",
    "load_checkpoint",
    "migrate_config",
]

#: The checkpoint entry that holds the resolved config of the run (and the format version).
CONFIG_KEY = "rl_lightning"
#: Version of what ``fit`` writes beside the weights. 1: before the algorithm protocol (no version
#: recorded); 2: ``log_every_n_updates`` is a root key, state-dict names of the shared parts.
FORMAT_VERSION = 2

#: Where a stored config's ``_target_`` may point, and what it must be there.
_TARGET_PREFIXES = ("rl_lightning.algos.", "rl_lightning.training.", "callbacks.")


class NotACheckpointError(ValueError):
    """The file is not a checkpoint written by ``fit``."""


# ---------------------------------------------------------------------------------------------- checkpoint
def load_checkpoint(path: str | Path, check_config: bool = True) -> dict[str, Any]:
    """Loads a checkpoint written by ``fit`` on the CPU, safely, migrated to :data:`FORMAT_VERSION`.

    Args:
        path: the checkpoint file.
        check_config: check every ``_target_`` of the stored config (:func:`check_targets`); ``evaluate`` and
            ``export`` rebuild the module from it. A resume builds everything from the command line's
            config instead, so it loads the weights and states only.

    Raises:
        FileNotFoundError: no such file.
        UnsafeFileError: the file holds Python objects (a pickle payload) that only an unsafe load runs.
        NotACheckpointError: the file is no checkpoint, or was not written by ``fit``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "global" in ln), None)
        if found is not None:
            raise UnsafeFileError(
                f"{path} holds Python objects that loading would have to run ({found.rstrip('.')}); it was "
                "not written by rl_lightning fit, so it is not loaded. Only load checkpoints you trust."
            ) from None
        raise NotACheckpointError(f"{path} is not a checkpoint written by rl_lightning fit.") from None
    except Exception as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise NotACheckpointError(
            f"{path} is not a checkpoint written by rl_lightning fit ({reason})."
        ) from None
    if not isinstance(ckpt, dict) or CONFIG_KEY not in ckpt or "state_dict" not in ckpt:
        raise NotACheckpointError(f"{path} was not written by rl_lightning fit (it has no stored config).")
    meta = ckpt[CONFIG_KEY]
    meta["config"] = migrate_config(meta.get("config") or {}, int(meta.get("format", 1)), path)
    meta["format"] = FORMAT_VERSION
    if check_config:
        check_targets(meta["config"], str(path))
    return ckpt


def migrate_config(config: dict[str, Any], version: int, source: str | Path = "checkpoint") -> dict[str, Any]:
    """The stored config of an older format, in today's layout.

    Raises:
        NotACheckpointError: the checkpoint is of a newer format than this version of the project reads.
    """
    if version > FORMAT_VERSION:
        raise NotACheckpointError(
            f"{source} was written by a newer rl_lightning (checkpoint format {version}, this version reads "
            f"up to {FORMAT_VERSION}); upgrade rl_lightning to load it."
        )
    if version < 2:
        algo = dict(config.get("algo") or {})
        if "log_every_n_updates" in algo:
            config.setdefault("log_every_n_updates", algo.pop("log_every_n_updates"))
        config["algo"] = algo
    return _moved_targets(config)


#: ``_target_`` s that moved: the old name, as stored configs hold it, and the new one.
MOVED_TARGETS = {"callbacks.HockeyCurriculum": "rl_lightning.training.hockey_curriculum.HockeyCurriculum"}


def _moved_targets(node: Any) -> Any:
    """``node`` with every ``_target_`` of :data:`MOVED_TARGETS` renamed."""
    if isinstance(node, Mapping):
        return {
            k: MOVED_TARGETS.get(v, v) if k == "_target_" and isinstance(v, str) else _moved_targets(v)
            for k, v in node.items()
        }
    if isinstance(node, list | tuple):
        return [_moved_targets(v) for v in node]
    return node


# ---------------------------------------------------------------------------------------------- config
def _targets(node: Any, where: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == "_target_":
                yield path, value
            else:
                yield from _targets(value, path)
    elif isinstance(node, list | tuple):
        for i, value in enumerate(node):
            yield from _targets(value, f"{where}[{i}]")


def check_targets(config: Mapping[str, Any], source: str = "the config") -> None:
    """Every ``_target_`` in ``config`` names one of the project's algorithms or callbacks.

    The name is checked before it is imported: only modules of ``rl_lightning.algos``,
    ``rl_lightning.training`` and ``callbacks`` are ever imported, and the object found must be an
    ``RLModule`` (algorithms) or a Lightning ``Callback`` class (the others).

    Raises:
        UnsafeFileError: a ``_target_`` points anywhere else.
    """
    import importlib

    import lightning as L

    from rl_lightning.algos.base import RLModule

    for key, target in _targets(config):
        ok = isinstance(target, str) and target.startswith(_TARGET_PREFIXES)
        obj = None
        if ok:
            module, _, name = target.rpartition(".")
            try:
                obj = getattr(importlib.import_module(module), name, None)
            except ImportError:
                obj = None
            wanted = RLModule if target.startswith("rl_lightning.algos.") else L.Callback
            ok = isinstance(obj, type) and issubclass(obj, wanted)
        if not ok:
            raise UnsafeFileError(
                f"{source}: {key}={target!r} is not one of rl_lightning's algorithms or callbacks; "
                "refusing to instantiate it. Only load checkpoints you trust."
            )
