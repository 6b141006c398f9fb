"""Environments: the gymnasium -> TorchRL factory, our own laser-hockey env and the trading envs.

Importing this package registers the hockey and the trading gymnasium ids (the trading envs read their
price data, an optional extra, only when one is made).
"""

from rl_lightning.envs.factory import EnvConfig, UnknownEnvError, check_env_id, make_env
from rl_lightning.envs.hockey import register_envs
from rl_lightning.envs.trading import register_trading_envs
from rl_lightning.envs.vector import GymVecEnv

register_envs()
register_trading_envs()

__all__ = ["EnvConfig", "GymVecEnv", "UnknownEnvError", "check_env_id", "make_env"]
