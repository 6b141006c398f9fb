"""The duck-typed protocol between a LightningModule and the optimization callbacks.

A module opts in by exposing:

- ``hot_paths: tuple[str, ...]``: names of methods ``TensorDict -> TensorDict`` (``update``, ``act``) with
  static shapes and no host syncs; callbacks replace them with wrapped versions for the duration of a fit.
- ``optimizer_kwargs: dict``: merged into every optimizer constructor in ``configure_optimizers``;
  callbacks add ``fused``/``capturable`` to it in ``setup``, which Lightning runs before
  ``configure_optimizers``.
- ``cuda_graph_safe: tuple[str, ...]`` (optional): the hot paths that may be captured as CUDA graphs.
- ``compile_regions: dict[str, tuple[str, ...]]`` (optional): for a hot path, the methods ``TorchCompile``
  compiles in its place. An ``update`` runs backward passes and optimizer steps, at which a compiled graph
  breaks; its losses, computed in methods of their own, compile into one graph each instead, and what runs
  between them (backward, optimizer steps, target updates) stays eager. A path without regions is compiled
  whole.
- ``direct_optimizers`` (for ``DirectSteps``): ``None``, or optimizers the callback set for a fit, which the
  update steps (with a plain ``loss.backward()``) instead of Lightning's wrappers.

A data module may hand Lightning batches that each hold several rounds of work (``rl_lightning``'s
experience stream does, until a callback's work is due). The callbacks here count time, steps or batches,
whatever a batch holds, and declare nothing about it; ``NonBlockingTransfer`` calls
``use_non_blocking_copies(enabled, pin_memory)`` on a data module's progress view
(``trainer.datamodule.progress``) where the data module makes its own host-to-device copies.

Replacing a method means shadowing it with an instance attribute. Several callbacks may wrap the same
path (compile, then CUDA graph); every layer is recorded here so that restoring one layer also drops the
layers stacked on top of it (they were built around it), whatever order Lightning calls the callbacks'
``on_fit_end`` in. After all restores the module is back to its class methods.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from torch import nn
from typing_extensions import override

_MISSING = object()


@dataclass
class _Layer:
    owner: object
    previous: Any
    wrapper: Callable[..., Any]


_STACKS: weakref.WeakKeyDictionary[nn.Module, dict[str, list[_Layer]]] = weakref.WeakKeyDictionary()


def check_paths_argument(paths: Sequence[str] | None, who: str) -> tuple[str, ...] | None:
    """Validate a ``paths=`` constructor argument: ``None`` (all hot paths) or a non-empty list of names."""
    if paths is None:
        return None
    if isinstance(paths, str) or not all(isinstance(p, str) and p for p in paths) or not paths:
        raise ValueError(
            f"{who}: paths={paths!r} must be None (all of the module's hot_paths) or a non-empty list of "
            "method names such as ['update', 'act']."
        )
    return tuple(paths)


def resolve_hot_paths(pl_module: nn.Module, paths: tuple[str, ...] | None, who: str) -> tuple[str, ...]:
    """The hot paths a callback acts on: ``paths`` if given, else the module's ``hot_paths``.

    Raises:
        TypeError: the module does not implement the protocol.
        ValueError: a requested path is not one of the module's hot paths.
    """
    declared = getattr(pl_module, "hot_paths", None)
    if declared is None:
        raise TypeError(
            f"{who} needs {type(pl_module).__name__} to implement the hot-path protocol: add a class "
            "attribute `hot_paths = ('update', 'act')` naming its TensorDict -> TensorDict methods, or "
            "remove the callback."
        )
    if isinstance(declared, str) or not all(isinstance(p, str) for p in declared):
        raise TypeError(
            f"{who}: {type(pl_module).__name__}.hot_paths={declared!r} must be a tuple of method names."
        )
    declared = tuple(declared)
    selected = declared if paths is None else paths
    unknown = [p for p in selected if p not in declared]
    if unknown:
        raise ValueError(
            f"{who}: paths {unknown} are not hot paths of {type(pl_module).__name__} (it declares "
            f"{declared}); choose paths among those."
        )
    for name in selected:
        if not callable(getattr(pl_module, name, None)):
            raise TypeError(
                f"{who}: {type(pl_module).__name__}.{name} is listed in hot_paths but is no method."
            )
    return selected


def resolve_compile_regions(pl_module: nn.Module, path: str, who: str) -> tuple[str, ...]:
    """The methods to compile for the hot path ``path``: the module's ``compile_regions`` for it, else the
    path itself.

    Raises:
        TypeError: ``compile_regions`` is not a dict of tuples of names, or a region is not a method.
    """
    declared = getattr(pl_module, "compile_regions", None) or {}
    if not isinstance(declared, dict):
        raise TypeError(
            f"{who}: {type(pl_module).__name__}.compile_regions={declared!r} must be a dict from hot paths "
            "to tuples of method names."
        )
    regions = declared.get(path, ())
    if isinstance(regions, str) or not all(isinstance(r, str) for r in regions):
        raise TypeError(
            f"{who}: {type(pl_module).__name__}.compile_regions[{path!r}]={regions!r} must be a tuple of "
            "method names."
        )
    for name in regions:
        if not callable(getattr(pl_module, name, None)):
            raise TypeError(
                f"{who}: {type(pl_module).__name__}.{name} is a compile region of {path!r} but is no method."
            )
    return tuple(regions) or (path,)


def require_optimizer_kwargs(pl_module: nn.Module, who: str) -> dict[str, Any]:
    """The module's ``optimizer_kwargs`` dict, or a clear error when the module lacks it."""
    kwargs = getattr(pl_module, "optimizer_kwargs", None)
    if not isinstance(kwargs, dict):
        raise TypeError(
            f"{who} needs {type(pl_module).__name__} to implement the optimizer protocol: an attribute "
            "`optimizer_kwargs: dict` set in __init__ and merged into every torch optimizer constructor in "
            "configure_optimizers (`torch.optim.Adam(params, lr=lr, **self.optimizer_kwargs)`)."
        )
    return kwargs


def wrap_hot_path(
    pl_module: nn.Module,
    name: str,
    make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]],
    owner: object,
) -> Callable[..., Any]:
    """Shadow ``pl_module.<name>`` with ``make_wrapper(current)``, where ``current`` is what is there now."""
    current = getattr(pl_module, name)
    previous = pl_module.__dict__.get(name, _MISSING)
    wrapper = make_wrapper(current)
    # object.__setattr__: a wrapper that happens to be an nn.Module must not become a registered submodule
    # (its parameters would show up twice in the state dict).
    object.__setattr__(pl_module, name, wrapper)
    _STACKS.setdefault(pl_module, {}).setdefault(name, []).append(_Layer(owner, previous, wrapper))
    return wrapper


def restore_hot_paths(pl_module: nn.Module, owner: object) -> None:
    """Remove every layer ``owner`` added (and the layers on top of them); idempotent."""
    for name, stack in _STACKS.get(pl_module, {}).items():
        index = next((i for i, layer in enumerate(stack) if layer.owner is owner), None)
        if index is None:
            continue
        previous = stack[index].previous
        if previous is _MISSING:
            pl_module.__dict__.pop(name, None)
        else:
            object.__setattr__(pl_module, name, previous)
        del stack[index:]


def wrapped_paths(pl_module: nn.Module) -> dict[str, int]:
    """How many wrapper layers each hot path currently carries (for tests and debugging)."""
    return {name: len(stack) for name, stack in _STACKS.get(pl_module, {}).items() if stack}


class HotPathCallback(Callback):
    """Base of the callbacks that wrap hot paths: their wrappers come off at the end of a fit, on an
    exception and at teardown, whichever comes first (restoring twice is harmless)."""

    def _restore(self, pl_module: pl.LightningModule) -> None:
        restore_hot_paths(pl_module, self)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._restore(pl_module)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore(pl_module)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore(pl_module)
