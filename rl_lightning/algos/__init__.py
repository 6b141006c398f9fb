"""Algorithms, one LightningModule per family."""

from rl_lightning.algos.base import IncompatibleEnvError, RLModule
from rl_lightning.algos.dqn import DQN
from rl_lightning.algos.tdmpc2 import TDMPC2

__all__ = ["DQN", "TDMPC2", "IncompatibleEnvError", "RLModule"]
