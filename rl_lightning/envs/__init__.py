"""Environments: the gymnasium -> TorchRL factory and our own laser-hockey env.

Importing this package registers the hockey gymnasium ids.
"""

from rl_lightning.envs.factory import EnvConfig, UnknownEnvError, check_env_id, make_env
from rl_lightning.envs.hockey import register_envs
from rl_lightning.envs.vector import GymVecEnv

register_envs()

__all__ = ["EnvConfig", "GymVecEnv", "UnknownEnvError", "check_env_id", "make_env"]
