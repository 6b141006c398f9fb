"""Process-wide settings of a command: they belong to the CLI, never to library code."""

from __future__ import annotations

import logging
import os
import warnings

import torch
from omegaconf import DictConfig

__all__ = ["apply_process_settings", "quiet_libraries"]


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def quiet_libraries() -> None:
    """Keeps the console to what matters for a run."""
    # Both libraries read these when first imported, so they are set before any import of them.
    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("RL_WARNINGS", "False")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    for name in ("torchrl", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())


def apply_process_settings(cfg: DictConfig) -> None:
    """Torch threads (``torch_threads``) for this process."""
    threads = cfg.get("torch_threads")
    if threads is not None:
        if int(threads) < 1:
            raise ValueError("torch_threads must be >= 1 or null (torch's default).")
        torch.set_num_threads(int(threads))
