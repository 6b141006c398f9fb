"""What a run needs around the algorithm: checkpoints, evaluation, update feedback, progress, metrics.

The names below load their module on first use (PEP 562): a module of the package that needs no
Lightning, such as ``stats`` (read by ``report``, ``plot`` and the docs build), imports without it.
"""

import importlib
from typing import Any

#: Each name of the package -> the module that defines it.
_HOMES = {
    "EvalCallback": "evaluation",
    "FrameCheckpoint": "checkpoint",
    "FramesProgressBar": "progress",
    "UpdateFeedback": "feedback",
    "evaluate_policy": "evaluation",
    "evaluate_variants": "evaluation",
    "log_metrics": "metrics",
    "replay_path": "checkpoint",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
