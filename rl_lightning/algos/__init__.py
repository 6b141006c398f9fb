"""Algorithms, one LightningModule per family."""

from rl_lightning.algos.base import IncompatibleEnvError, RLModule
from rl_lightning.algos.dqn import DQN
from rl_lightning.algos.quantile import ACIQN, C51, IQN, QRDQN
from rl_lightning.algos.tdmpc2 import TDMPC2

__all__ = ["ACIQN", "C51", "DQN", "IQN", "QRDQN", "TDMPC2", "IncompatibleEnvError", "RLModule"]
