"""The private APIs of torch, TensorDict and TorchRL that the project uses, each in one place.

Every entry is a speed-up (or a quieter exit) over a public path that gives the same result; each checks
that what it relies on exists and falls back to that public path otherwise, so a release that removes or
renames the private symbol costs speed, never correctness. ``tests/test_compat.py`` runs every fallback
against the fast path. ``docs/optimizations.md`` lists the entries and why each is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict

__all__ = [
    "HAS_FAST_TD", "HAS_FOREACH", "build_td", "foreach_lerp_", "foreach_mul_", "foreach_norm",
    "skip_private_key_filter", "td_entries",
]  # fmt: skip

#: ``TensorDict._new_unsafe`` (build without checking every entry) and ``TensorDict._tensordict`` (the
#: entries as a dict): TensorDict's own constructor and ``items()`` check and dispatch per entry, several
#: times the cost of the copies for the one-frame batches of RL (``benchmarks/results/replay_storage.json``).
HAS_FAST_TD = callable(getattr(TensorDict, "_new_unsafe", None)) and isinstance(
    getattr(TensorDict({}, []), "_tensordict", None), dict
)


def build_td(
    entries: dict[str, Any], batch_size: torch.Size, device: torch.device | None, fast: bool = HAS_FAST_TD
) -> TensorDict:
    """A ``TensorDict`` of ``entries`` (tensors, or ``TensorDict`` s) that already have the batch size and
    device: built without checking them where TensorDict allows it, else with the public constructor."""
    if fast:
        return TensorDict._new_unsafe(entries, batch_size=batch_size, device=device)
    return TensorDict(entries, batch_size=batch_size, device=device)


def td_entries(td: TensorDict, fast: bool = HAS_FAST_TD) -> Mapping[str, Any]:
    """The top-level entries of a plain ``TensorDict`` (nested ones as ``TensorDict`` s), without a copy
    where TensorDict allows it."""
    if fast:
        return td._tensordict
    return dict(td.items())


def skip_private_key_filter(collector: Any) -> bool:
    """Turns off a TorchRL collector's removal of private (``"_"``-prefixed) keys from every batch, a walk
    over all its keys (about a tenth of a one-frame collection), for a caller that stores named keys only.
    Where the collector has no such switch (``_exclude_private_keys``, TorchRL 0.14) it keeps filtering:
    slower, the same rows. Returns whether the switch was there."""
    if not isinstance(getattr(collector, "_exclude_private_keys", None), bool):
        return False
    collector._exclude_private_keys = False
    return True


#: torch's multi-tensor kernels (``torch._foreach_*``, what its optimizers and ``clip_grad_norm_`` run): one
#: dispatch for a list of tensors instead of one per tensor.
HAS_FOREACH = all(callable(getattr(torch, f"_foreach_{op}", None)) for op in ("lerp_", "norm", "mul_"))


def foreach_lerp_(
    targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float, fast: bool = HAS_FOREACH
) -> None:
    """``t.lerp_(s, weight)`` for each pair, in one multi-tensor kernel where torch has it."""
    if fast:
        torch._foreach_lerp_(targets, sources, weight)
        return
    for t, s in zip(targets, sources):
        t.lerp_(s, weight)


def foreach_norm(tensors: list[torch.Tensor], fast: bool = HAS_FOREACH) -> list[torch.Tensor]:
    """The 2-norm of each tensor."""
    if fast:
        return list(torch._foreach_norm(tensors))
    return [torch.linalg.vector_norm(t) for t in tensors]


def foreach_mul_(tensors: list[torch.Tensor], scalar: torch.Tensor, fast: bool = HAS_FOREACH) -> None:
    """``t.mul_(scalar)`` for each tensor."""
    if fast:
        torch._foreach_mul_(tensors, scalar)
        return
    for t in tensors:
        t.mul_(scalar)
