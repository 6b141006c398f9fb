"""rl_lightning: reinforcement learning on PyTorch Lightning, TorchRL data, Hydra config and MLflow runs.

The Python API (:mod:`rl_lightning.api`; docs/python-api.md): ``config``, ``build``, ``fit``, ``load``,
``act`` and ``FitResult``. They load on first use, so ``import rl_lightning`` stays light.
"""

from typing import Any

__version__ = "0.1.0"

__all__ = ["FitResult", "__version__", "act", "build", "config", "fit", "load"]


def __getattr__(name: str) -> Any:
    if name in __all__ and name != "__version__":
        from rl_lightning import api

        return getattr(api, name)
    raise AttributeError(f"module 'rl_lightning' has no attribute {name!r}")
