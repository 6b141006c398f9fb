"""Non-blocking, pinned host-to-device transfer of TensorDict batches."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.model_helpers import is_overridden
from lightning_utilities.core.apply_func import apply_to_collection
from tensordict import TensorDictBase
from typing_extensions import override

from callbacks._compat import Transferable
from callbacks._logging import notice_once

_HOOK = "transfer_batch_to_device"
#: The method of a data module's progress view that switches its own host-to-device copies.
_COPIES = "use_non_blocking_copies"


class NonBlockingTransfer(Callback):
    """Copy batches to the GPU with ``non_blocking=True``, through pinned host memory when they are on CPU.

    Two kinds of data module, two ways:

    - A data module that makes its host-to-device copies itself (a stream whose Lightning "batch" is not the
      data, such as an RL data path that copies observations, frames and samples where it needs them)
      publishes a progress view (``trainer.datamodule.progress``, the one part of a data module callbacks
      read) with ``use_non_blocking_copies(enabled: bool, pin_memory: bool)``; ``setup`` calls it with
      ``enabled=True`` and ``teardown`` with ``False``.
    - Otherwise Lightning moves each batch with ``move_data_to_device``, which passes ``non_blocking=True``
      to plain tensors only; a ``TensorDict`` gets ``.to(device)`` and whatever its default is, and a
      pageable source cannot be copied asynchronously anyway. A callback cannot override
      ``transfer_batch_to_device``, so ``setup`` shadows the module's hook with one that moves every
      ``TensorDict`` and tensor with ``non_blocking=True``, pinning CPU sources first, and hands everything
      else to Lightning's ``move_data_to_device``; ``teardown`` removes it. The shadow stands in for the
      default hook (its ``__wrapped__``), so Lightning still sees the module as not overriding it and picks
      the same object as without the callback: a data module's own ``transfer_batch_to_device`` when it
      has one (which knows its batch better: left alone, with a notice at the first batch), else the
      module's, now the shadow. A batch already on the device is returned as is. A module's own
      ``transfer_batch_to_device`` is left alone (with a notice).

    On CPU this is a no-op with a one-time notice. Pinned staging costs one host copy per batch; it pays
    off when the batch is large enough for the device copy to overlap with compute. Safe to reuse the source
    right away: PyTorch keeps a pinned block alive until the copy reading it has finished.

    Metrics: none; ``batches_moved`` counts the batches the module's shadow hook moved in the fit (the
    positive control of a test; a data module that copies its own data counts its copies). State: none.

    Args:
        pin_memory: stage CPU batches in pinned memory so the host-to-device copy is truly asynchronous.

    Example:
        >>> trainer = pl.Trainer(callbacks=[NonBlockingTransfer(pin_memory=True)], accelerator="gpu")
    """

    def __init__(self, pin_memory: bool = True) -> None:
        if not isinstance(pin_memory, bool):
            raise ValueError(f"NonBlockingTransfer: pin_memory={pin_memory!r} must be True or False.")
        self.pin_memory = pin_memory
        #: What was switched: the progress view's copies, or the module whose hook is shadowed.
        self._owner: object | None = None
        self.batches_moved = 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.strategy.root_device.type != "cuda":
            notice_once(self, "NonBlockingTransfer: no CUDA device; batches are moved by Lightning as usual.")
            return
        if self._owner is not None:
            return
        progress = getattr(getattr(trainer, "datamodule", None), "progress", None)
        switch = getattr(progress, _COPIES, None)
        if callable(switch):
            switch(True, pin_memory=self.pin_memory)
            self._owner = progress
            return
        if is_overridden(_HOOK, pl_module):
            notice_once(
                self,
                f"NonBlockingTransfer: {type(pl_module).__name__} overrides {_HOOK}; "
                "its transfer is left alone.",
            )
            return
        self._owner, self.batches_moved = pl_module, 0
        object.__setattr__(pl_module, _HOOK, self._shadow())

    def _shadow(self) -> Any:
        """The module's stand-in hook: this callback's transfer, marked as the default hook it replaces."""

        def transfer_batch_to_device(batch: Any, device: torch.device, dataloader_idx: int = 0) -> Any:
            self.batches_moved += 1
            return self.transfer_batch_to_device(batch, device, dataloader_idx)

        transfer_batch_to_device.__wrapped__ = pl.LightningModule.transfer_batch_to_device  # type: ignore[attr-defined]
        return transfer_batch_to_device

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._owner is pl_module and not self.batches_moved:
            notice_once(
                self,
                f"NonBlockingTransfer: the data module's own {_HOOK} moved the batch; "
                "its transfer is left alone.",
            )

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int = 0) -> Any:
        """Move tensors and TensorDicts non-blocking (CPU sources pinned first), the rest as usual."""
        return apply_to_collection(batch, Transferable, self._move, device=device)

    def _move(self, data: Any, device: torch.device) -> Any:
        if not isinstance(data, TensorDictBase | torch.Tensor):
            return move_data_to_device(data, device)
        source = _source_device(data)
        if source == device:
            return data
        pin = self.pin_memory and device.type == "cuda" and source is not None and source.type == "cpu"
        if isinstance(data, TensorDictBase):
            # num_threads=0: pin leaf by leaf in this thread; a thread pool only pays off for huge batches.
            return data.to(device, non_blocking=True, non_blocking_pin=pin, num_threads=0)
        if pin and not data.is_pinned():
            data = data.pin_memory()
        return data.to(device, non_blocking=True)

    def _restore(self) -> None:
        owner, self._owner = self._owner, None
        if owner is None:
            return
        if isinstance(owner, pl.LightningModule):
            vars(owner).pop(_HOOK, None)
        else:
            getattr(owner, _COPIES)(False, pin_memory=self.pin_memory)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._restore()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._restore()


def _source_device(data: torch.Tensor | TensorDictBase) -> torch.device | None:
    """The device of ``data``; for a device-less TensorDict, the device all its leaves share (else None)."""
    if data.device is not None or not isinstance(data, TensorDictBase):
        return data.device
    devices = {leaf.device for leaf in data.values(True, True) if isinstance(leaf, torch.Tensor)}
    return devices.pop() if len(devices) == 1 else None
