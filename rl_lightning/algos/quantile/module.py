"""What the distributional members share beyond the value-based base: the discount of an n-step sample.

Acting, the update (with the noisy layers' fresh noise), the target update and the shared hyperparameters
of C51, QR-DQN and IQN are :class:`~rl_lightning.algos.value_based.ValueBased`'s, as DQN's are; AC-IQN,
an actor-critic, uses :func:`td_discount` too.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torch import Tensor

__all__ = ["td_discount"]


def td_discount(batch: TensorDictBase, gamma: float) -> tuple[Tensor, Tensor]:
    """The reward ``[B, 1]`` and the bootstrap factor ``gamma ** steps_to_next_obs * (1 - terminated)``.

    ``steps_to_next_obs`` (written by the n-step transform) is 1 when absent.
    """
    reward = batch.get(("next", "reward")).float().reshape(-1, 1)
    alive = 1.0 - batch.get(("next", "terminated")).float().reshape(-1, 1)
    steps = batch.get("steps_to_next_obs", None)
    if steps is None:
        return reward, gamma * alive
    return reward, torch.pow(gamma, steps.float().reshape(-1, 1)) * alive
