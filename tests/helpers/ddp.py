"""A callback that the DDP tests add through the config (``+callbacks.dump._target_=helpers.ddp.ParamDump``,
with the tests root on ``PYTHONPATH``): every rank saves its parameters at the end."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch


class ParamDump(L.Callback):
    """Writes ``<out>/rank_<r>.pt``: the module's state dict on rank ``r`` when training ends."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu() for k, v in pl_module.state_dict().items()}
        torch.save(state, self.out / f"rank_{trainer.global_rank}.pt")
