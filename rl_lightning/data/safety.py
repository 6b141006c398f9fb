"""Checking a replay directory before anything of it is loaded (see ``rl_lightning.training.safe_load``).

TorchRL's replay format is memory-mapped tensors plus JSON metadata, except that ``ReplayBuffer.loads``
reads ``prefetch.pkl`` with ``pickle.load`` and TensorDict's loader imports the class named in
``meta.json``. A directory from someone else could use either to run code. :func:`check_replay_dir`
accepts memory-mapped tensors, JSON metadata naming plain TensorDicts, ``torch.save`` files (loaded with
``weights_only=True``) and pickles whose opcodes build plain values only (no global lookups, so nothing can
be called); anything else is refused before loading starts.
"""

from __future__ import annotations

import json
import pickletools
from pathlib import Path

__all__ = ["UnsafeFileError", "check_replay_dir"]

_TENSORDICT_TYPES = {"<class 'tensordict._td.TensorDict'>"}
#: Pickle opcodes that look up or call something: a pickle without them builds plain values only.
_CALLING_OPCODES = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "BUILD", "EXT1",
                    "EXT2", "EXT4", "PERSID", "BINPERSID"}  # fmt: skip


class UnsafeFileError(ValueError):
    """A checkpoint, config or replay directory holds something that loading it would have to run."""


def _pickle_is_plain(path: Path) -> bool:
    try:
        return not any(op.name in _CALLING_OPCODES for op, _, _ in pickletools.genops(path.read_bytes()))
    except Exception:
        return False


def _json_is_plain(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        return False
    if path.name != "meta.json":
        return True
    # TensorDict metadata: plain TensorDicts only (a tensorclass or pytree type would be imported by name).
    stack = [data]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "_type" in node and node["_type"] not in _TENSORDICT_TYPES:
                return False
            if any(k in node for k in ("_tensorclass_type", "_pytree_type", "_non_tensor")):
                return False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return True


def check_replay_dir(path: str | Path) -> None:
    """Checks a replay directory written by ``save_replay`` before anything of it is loaded.

    Raises:
        FileNotFoundError: no such directory.
        UnsafeFileError: it holds a file of another kind, a link, a pickle that would look up or call
            something, or metadata naming a class other than a plain TensorDict.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(
            f"No replay buffer beside the checkpoint ({path}); resume from a 'last' checkpoint, "
            "which is saved with its buffer."
        )
    for item in sorted(path.rglob("*")):
        problem = None
        if item.is_symlink():
            problem = "a link"
        elif item.is_dir() or item.suffix == ".memmap":
            continue
        elif item.suffix == ".json":
            problem = None if _json_is_plain(item) else "metadata naming a class that loading would import"
        elif item.suffix == ".pkl":
            problem = None if _pickle_is_plain(item) else "a pickle that would call code when loaded"
        elif item.suffix in (".pt", ".t"):
            continue  # loaded with torch.load(weights_only=True)
        else:
            problem = "a file of an unknown kind"
        if problem:
            raise UnsafeFileError(
                f"replay directory {path}: {item.relative_to(path)} is {problem}; refusing to load it. "
                "Resume only from checkpoints you trust, or start a new run."
            )
