"""Shared neural-network layers."""

from rl_lightning.nn.layers import Ensemble, Mish, NormedLinear, SimNorm, mlp

__all__ = ["Ensemble", "Mish", "NormedLinear", "SimNorm", "mlp"]
