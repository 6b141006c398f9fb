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
#: The method of a data module that makes its own host-to-device copies.
_COPIES = "use_non_blocking_copies"


class NonBlockingTransfer(Callback):
    """Copy batches to the GPU with ``non_blocking=True``, through pinned host memory when they are on CPU.

    Two kinds of data module, two ways:

    - A data module that makes its host-to-device copies itself (a stream whose Lightning "batch" is not the
      data, such as an RL data path that copies observations, frames and samples where it needs them)
      exposes ``use_non_blocking_copies(enabled: bool, pin_memory: bool)``; ``setup`` calls it with
      ``enabled=True`` and ``teardown`` with ``False``.
    - Otherwise Lightning moves each batch with ``move_data_to_device``, which passes ``non_blocking=True``
      to plain tensors only; a ``TensorDict`` gets ``.to(device)`` and whatever its default is, and a
      pageable source cannot be copied asynchronously anyway. A callback cannot override
      ``transfer_batch_to_device``, so ``setup`` shadows that hook on the object Lightning calls it on: the
      data module when there is one (Lightning prefers a data module's hook), else the module. The shadow
      moves every ``TensorDict`` and tensor with ``non_blocking=True``, pinning CPU sources first, and hands
      everything else to Lightning's ``move_data_to_device``; ``teardown`` removes it. A batch already on the
      device is returned as is. A custom ``transfer_batch_to_device`` is left alone (with a notice): it
      knows its batch better.

    On CPU this is a no-op with a one-time notice. Pinned staging costs one host copy per batch; it pays
    off when the batch is large enough for the device copy to overlap with compute. Safe to reuse the source
    right away: PyTorch keeps a pinned block alive until the copy reading it has finished.

    Metrics: none. State: none.

    Args:
        pin_memory: stage CPU batches in pinned memory so the host-to-device copy is truly asynchronous.

    Example:
        >>> trainer = pl.Trainer(callbacks=[NonBlockingTransfer(pin_memory=True)], accelerator="gpu")
    """

    def __init__(self, pin_memory: bool = True) -> None:
        if not isinstance(pin_memory, bool):
            raise ValueError(f"NonBlockingTransfer: pin_memory={pin_memory!r} must be True or False.")
        self.pin_memory = pin_memory
        self._owner: object | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if trainer.strategy.root_device.type != "cuda":
            notice_once(self, "NonBlockingTransfer: no CUDA device; batches are moved by Lightning as usual.")
            return
        if self._owner is not None:
            return
        datamodule = trainer.datamodule
        if callable(getattr(datamodule, _COPIES, None)):
            getattr(datamodule, _COPIES)(True, pin_memory=self.pin_memory)
            self._owner = datamodule
            return
        custom = [obj for obj in (datamodule, pl_module) if obj is not None and is_overridden(_HOOK, obj)]
        if custom:
            notice_once(
                self,
                f"NonBlockingTransfer: {type(custom[0]).__name__} overrides {_HOOK}; "
                "its transfer is left alone.",
            )
            return
        self._owner = datamodule if datamodule is not None else pl_module
        object.__setattr__(self._owner, _HOOK, self.transfer_batch_to_device)

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
        if self._owner is None:
            return
        if _HOOK in self._owner.__dict__:
            self._owner.__dict__.pop(_HOOK)
        else:
            getattr(self._owner, _COPIES)(False, pin_memory=self.pin_memory)
        self._owner = None

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
