"""Shared neural-network layers."""

from rl_lightning.nn.layers import Ensemble, Mish, NormedLinear, SimNorm, mlp
from rl_lightning.nn.noisy import NoisyLinear, NoisyMLP
from rl_lightning.nn.quantile import (
    CosineEmbedding,
    DistributionalHead,
    DistributionalQNet,
    ImplicitQuantileNet,
)

__all__ = [
    "CosineEmbedding",
    "DistributionalHead",
    "DistributionalQNet",
    "Ensemble",
    "ImplicitQuantileNet",
    "Mish",
    "NoisyLinear",
    "NoisyMLP",
    "NormedLinear",
    "SimNorm",
    "mlp",
]
