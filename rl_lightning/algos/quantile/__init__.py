"""The distributional family: C51 (and Rainbow), QR-DQN, IQN with risk-sensitive acting, AC-IQN.

- ``math``: the quantile Huber loss, the categorical projection and the distortion risk measures.
- ``module``: the discount of an n-step sample, which every member uses.
- ``c51``, ``qrdqn``, ``iqn``: the discrete members, on the value-based base
  (:mod:`rl_lightning.algos.value_based`, with DQN); ``aciqn``: the continuous-action actor-critic.
"""

from rl_lightning.algos.quantile.aciqn import ACIQN
from rl_lightning.algos.quantile.c51 import C51
from rl_lightning.algos.quantile.iqn import IQN
from rl_lightning.algos.quantile.qrdqn import QRDQN

__all__ = ["ACIQN", "C51", "IQN", "QRDQN"]
