"""Algorithms, one LightningModule per family."""

from rl_lightning.algos.base import IncompatibleEnvError, RLModule
from rl_lightning.algos.dqn import DQN

__all__ = ["DQN", "IncompatibleEnvError", "RLModule"]
