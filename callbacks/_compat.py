"""Every private name of torch and Lightning that ``callbacks`` uses, each in one place.

The callbacks' counterpart of ``rl_lightning/compat.py`` (``callbacks`` may not import ``rl_lightning``):
each entry says which versions it was checked on (:data:`CHECKED`) and why the private name is worth it,
takes the private path only where the name exists and the installed version lies in that range, and has a
public path otherwise that gives the same results (``tests/test_compat.py``). ``tests/test_private_names.py``
fails on a private name of a dependency anywhere else in ``callbacks``.
"""

from __future__ import annotations

import functools
import re
from abc import ABC
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch

__all__ = [
    "CHECKED", "HAS_DIRECT_STEPS", "Transferable", "checked", "foreach_add_", "foreach_zero_",
    "fused_adam_kernel", "has_step_hooks", "manual_step_progress",
]  # fmt: skip

#: The versions each group of entries was checked on, as ``[low, high)``; the suite ran on the versions
#: ``docs/compatibility.md`` lists.
CHECKED: dict[str, tuple[str, str]] = {"torch": ("2.11", "2.15"), "lightning": ("2.6", "2.7")}


@functools.cache
def checked(package: str) -> bool:
    """Whether the installed ``package`` lies in the range its entries were checked on (:data:`CHECKED`)."""
    low, high = (_release(v) for v in CHECKED[package])
    try:
        installed = _release(metadata.version(package))
    except metadata.PackageNotFoundError:
        return False
    return low <= installed < high


def _release(version: str) -> tuple[int, ...]:
    """The release numbers of a version (``"2.13.0+cpu"`` -> ``(2, 13, 0)``), without ``packaging``, which
    ``callbacks`` does not depend on; ``(2, 13)`` sorts before ``(2, 13, 0)``, as a range's ends need."""
    found = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(part) for part in found.group().split(".")) if found else ()


try:  # torch's registries of global optimizer hooks, which a direct step must find empty
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks
except ImportError:  # pragma: no cover - a torch without them: the public steps run
    _global_optimizer_pre_hooks = _global_optimizer_post_hooks = None

#: What ``DirectSteps``' direct optimizer steps use (checked on torch 2.13.0): the multi-tensor
#: ``_foreach_zero_``/``_foreach_add_``, the fused Adam kernels ``_fused_adam_``/``_fused_adamw_`` that
#: ``Adam.step`` calls, and the hook registries (global ones, and each optimizer's
#: ``_optimizer_step_pre_hooks``/``_optimizer_step_post_hooks``) that must be empty for the kernel alone to
#: be the whole step. Calling the kernel directly skips what ``step`` adds around it: 84 against 46 us per
#: step of a ``[256, 256]`` Q-network on a CPU. Without them every step is ``Optimizer.zero_grad`` and
#: ``Optimizer.step``: the same bits, the speed-up lost.
HAS_DIRECT_STEPS = (
    checked("torch")
    and _global_optimizer_pre_hooks is not None
    and all(
        callable(getattr(torch, name, None))
        for name in ("_foreach_zero_", "_foreach_add_", "_fused_adam_", "_fused_adamw_")
    )
    and hasattr(torch.optim.SGD([torch.zeros(1, requires_grad=True)]), "_optimizer_step_post_hooks")
)


def foreach_zero_(tensors: list[torch.Tensor], fast: bool = HAS_DIRECT_STEPS) -> None:
    """Zeroes each tensor, in one multi-tensor kernel where torch has it."""
    if fast:
        torch._foreach_zero_(tensors)
        return
    for t in tensors:
        t.zero_()


def foreach_add_(tensors: list[torch.Tensor], value: float, fast: bool = HAS_DIRECT_STEPS) -> None:
    """Adds ``value`` to each tensor, in one multi-tensor kernel where torch has it."""
    if fast:
        torch._foreach_add_(tensors, value)
        return
    for t in tensors:
        t.add_(value)


def has_step_hooks(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a step of ``optimizer`` would run hooks (its own or the global ones); ``True`` where this
    torch keeps them elsewhere, so a caller then steps through ``Optimizer.step``."""
    if not HAS_DIRECT_STEPS:
        return True
    return bool(
        getattr(optimizer, "_optimizer_step_pre_hooks", True)
        or getattr(optimizer, "_optimizer_step_post_hooks", True)
        or _global_optimizer_pre_hooks
        or _global_optimizer_post_hooks
    )


def fused_adam_kernel(decoupled_weight_decay: bool) -> Callable[..., Any]:
    """torch's fused Adam kernel (``_fused_adamw_`` with decoupled weight decay), which ``Adam.step`` calls
    with the same arguments for a fused optimizer; only under :data:`HAS_DIRECT_STEPS`."""
    return torch._fused_adamw_ if decoupled_weight_decay else torch._fused_adam_


def manual_step_progress(trainer: Any) -> Any:
    """Lightning's count of manual-optimization steps (``trainer.global_step`` under manual optimization):
    ``fit_loop.epoch_loop.manual_optimization.optim_step_progress``, the loops' internals (checked on
    Lightning 2.6.6), which ``LightningOptimizer.step`` increments. ``None`` where the loops keep it
    elsewhere or Lightning lies outside :data:`CHECKED`: a caller then keeps Lightning's own steps."""
    if not checked("lightning"):
        return None
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    progress = getattr(getattr(loop, "manual_optimization", None), "optim_step_progress", None)
    needed = ("increment_ready", "increment_completed", "increment_by", "total")
    return progress if all(hasattr(progress, name) for name in needed) else None


class Transferable(ABC):  # noqa: B024 - an ABC for isinstance checks only
    """What ``move_data_to_device`` moves: anything with a callable ``to`` (tensors, TensorDicts, modules).

    The same test as Lightning's private ``_TransferableDataType`` (``lightning.fabric.utilities.apply_func``,
    2.6.6), written here instead of imported: ``apply_to_collection`` finds the same leaves with either.
    """

    @classmethod
    def __subclasshook__(cls, subclass: Any) -> bool | Any:
        if cls is Transferable:
            return callable(getattr(subclass, "to", None))
        return NotImplemented
