"""Fused (single-kernel) optimizer steps through the module's ``optimizer_kwargs``."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from callbacks._logging import notice_once
from callbacks._protocol import require_optimizer_kwargs


def fused_supported(device: torch.device) -> bool:
    """Whether this torch build has a fused Adam kernel for ``device`` (probed on a one-element parameter)."""
    try:
        param = torch.zeros(1, device=device, requires_grad=True)
        optimizer = torch.optim.Adam([param], fused=True)
        param.grad = torch.zeros_like(param)
        optimizer.step()
    except (RuntimeError, ValueError):
        return False
    return True


class FusedOptimizer(Callback):
    """Build every optimizer of the module with ``fused=True``: one kernel per step, not one per tensor.

    In ``setup`` (before Lightning calls ``configure_optimizers``) the module's ``optimizer_kwargs`` gets
    ``fused=True`` (and ``capturable=True`` if asked, on CUDA) and loses ``foreach``, which excludes
    ``fused``. The module must merge ``optimizer_kwargs`` into every optimizer it builds; a module without
    the attribute is refused. ``on_fit_start`` checks that the optimizers did come out fused and warns about
    those that did not.

    Device support is probed once in ``setup`` on the run's device: CUDA always has the fused Adam/AdamW/SGD
    kernels; recent torch (2.4+) has them on CPU too, and they are used there. Where the probe fails, a
    notice is given and ``foreach=True`` is used instead. ``capturable`` only matters for CUDA graphs and
    is ignored off CUDA (a notice says so). The kwargs are left in place after the fit: the optimizers were
    built with them.

    Metrics: none. State: none.

    Args:
        capturable: also build the optimizers ``capturable=True`` (step counters on the device), needed for
            capturing the update in a CUDA graph. ``CudaGraphs`` sets it itself.

    Example:
        >>> trainer = pl.Trainer(callbacks=[FusedOptimizer(capturable=False)])
    """

    def __init__(self, capturable: bool = False) -> None:
        if not isinstance(capturable, bool):
            raise ValueError(f"FusedOptimizer: capturable={capturable!r} must be True or False.")
        self.capturable = capturable
        self.fused: bool | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        kwargs = require_optimizer_kwargs(pl_module, "FusedOptimizer")
        device = trainer.strategy.root_device
        self.fused = fused_supported(device)
        kwargs.pop("foreach", None)
        if self.fused:
            kwargs["fused"] = True
        else:
            kwargs["foreach"] = True
            notice_once(
                self, f"FusedOptimizer: no fused optimizer kernels on {device.type}; using foreach=True."
            )
        if self.capturable:
            if device.type == "cuda":
                kwargs["capturable"] = True
            else:
                notice_once(
                    self, "FusedOptimizer: capturable=True is ignored off CUDA (it is for CUDA graphs)."
                )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        flag = "fused" if self.fused else "foreach"
        plain = [type(o).__name__ for o in trainer.optimizers if not _defaults(o).get(flag)]
        if plain:
            rank_zero_warn(
                f"FusedOptimizer: optimizers {plain} were not built with {flag}=True; build them in "
                "configure_optimizers with `**self.optimizer_kwargs`, and use Adam/AdamW/SGD (fused kernels)."
            )


def _defaults(optimizer: Any) -> dict[str, Any]:
    return getattr(optimizer, "defaults", {}) or {}
