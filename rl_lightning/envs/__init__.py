"""Environments: the gymnasium -> TorchRL factory, our own laser-hockey and marine-navigation envs, trading.

Importing this package registers the hockey, the marine-navigation and the trading gymnasium ids (the
trading envs read their price data, an optional extra, only when one is made).
"""

from rl_lightning.envs.factory import EnvConfig, UnknownEnvError, check_env_id, make_env
from rl_lightning.envs.hockey import register_envs
from rl_lightning.envs.marinenav import register_envs as register_marinenav_envs
from rl_lightning.envs.trading import register_trading_envs
from rl_lightning.envs.vector import GymVecEnv

register_envs()
register_marinenav_envs()
register_trading_envs()

__all__ = ["EnvConfig", "GymVecEnv", "UnknownEnvError", "check_env_id", "make_env"]
