"""Actor and critic networks of the actor-critic family (SAC, discrete SAC, TD3, DDPG).

Plain ``nn.Module`` MLPs, so that the algorithms can call them directly on their hot paths (acting) and
wrap them as TensorDict modules for TorchRL's losses. Actions are in ``[-1, 1]`` on the network side;
the algorithms map them to the env's bounds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torchrl.modules import MLP

__all__ = ["DeterministicActorNet", "GaussianActorNet", "QNet", "TanhMean", "mlp_head"]

#: Range of the Gaussian actor's log standard deviation (as in CleanRL's SAC and the SAC reference code).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def mlp_head(in_features: int, out_features: int, hidden_sizes: Sequence[int]) -> MLP:
    """A ReLU MLP ``[..., in_features] -> [..., out_features]`` with a linear last layer."""
    return MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(hidden_sizes),
        activation_class=nn.ReLU,
    )


class GaussianActorNet(nn.Module):
    """Observation -> the mean and standard deviation of a Gaussian over pre-tanh actions.

    The log standard deviation is squashed into ``[LOG_STD_MIN, LOG_STD_MAX]`` with a tanh (rather than
    clamped), so it keeps a gradient at the bounds.

    Args:
        obs_dim: observation size.
        action_dim: action size ``A``.
        hidden_sizes: hidden widths.

    Shapes:
        input ``[..., obs_dim]``; outputs ``loc [..., A]`` and ``scale [..., A]`` (positive).
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp_head(obs_dim, 2 * action_dim, hidden_sizes)

    def forward(self, observation: Tensor) -> tuple[Tensor, Tensor]:
        loc, log_std = self.net(observation).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1.0)
        return loc, log_std.exp()


class TanhMean(nn.Module):
    """A :class:`GaussianActorNet`'s deterministic action ``tanh(loc)``, in ``[-1, 1]`` (SAC's evaluation).

    Shapes:
        input ``[..., obs_dim]``; output ``[..., A]``.
    """

    def __init__(self, actor: GaussianActorNet) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, observation: Tensor) -> Tensor:
        loc, _ = self.actor(observation)
        return torch.tanh(loc)


class DeterministicActorNet(nn.Module):
    """Observation -> action in ``[-1, 1]`` (a tanh on the last layer), for TD3 and DDPG.

    Shapes:
        input ``[..., obs_dim]``; output ``[..., A]``.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp_head(obs_dim, action_dim, hidden_sizes)

    def forward(self, observation: Tensor) -> Tensor:
        return torch.tanh(self.net(observation))


class QNet(nn.Module):
    """``Q(s, a)`` for continuous actions: the concatenation of observation and action through an MLP.

    Shapes:
        inputs ``observation [..., obs_dim]`` and ``action [..., A]``; output ``[..., 1]``.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp_head(obs_dim + action_dim, 1, hidden_sizes)

    def forward(self, observation: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([observation, action], dim=-1))
