"""Algorithms, one LightningModule per family."""

from rl_lightning.algos.base import IncompatibleEnvError, RLModule
from rl_lightning.algos.dqn import DQN
from rl_lightning.algos.options import SACOptions
from rl_lightning.algos.quantile import ACIQN, C51, IQN, QRDQN
from rl_lightning.algos.sac import SAC
from rl_lightning.algos.sac_discrete import DiscreteSAC
from rl_lightning.algos.td3 import DDPG, TD3
from rl_lightning.algos.tdmpc2 import TDMPC2
from rl_lightning.algos.value_based import ValueBased, ValueBasedHParams

__all__ = [
    "ACIQN",
    "C51",
    "DDPG",
    "DQN",
    "IQN",
    "QRDQN",
    "SAC",
    "TD3",
    "TDMPC2",
    "DiscreteSAC",
    "IncompatibleEnvError",
    "RLModule",
    "SACOptions",
    "ValueBased",
    "ValueBasedHParams",
]
