"""Shared neural-network layers."""

from rl_lightning.nn.layers import Ensemble, NormedLinear, SimNorm, mlp

__all__ = ["Ensemble", "NormedLinear", "SimNorm", "mlp"]
