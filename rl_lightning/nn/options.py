"""Networks of SAC with options: intra-option policies, option critics and terminations for ``K`` options.

Every network evaluates all ``K`` options in one call: a shared trunk (the hidden layers of one MLP) and
per-option heads (its last linear layer, ``K`` times as wide, reshaped). With ``K = 1`` each one has
exactly the layout of its flat SAC counterpart in :mod:`rl_lightning.nn.actor_critic`, which is what
lets SAC with one option reproduce SAC's update.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rl_lightning.nn.actor_critic import LOG_STD_MAX, LOG_STD_MIN, mlp_head

__all__ = [
    "OptionCategoricalActorNet",
    "OptionDiscreteQNet",
    "OptionGaussianActorNet",
    "OptionQNet",
    "TerminationNet",
]


class OptionGaussianActorNet(nn.Module):
    """Observation -> a Gaussian over pre-tanh actions for each of the ``K`` options.

    The log standard deviation is squashed into ``[LOG_STD_MIN, LOG_STD_MAX]`` with a tanh, as in
    :class:`rl_lightning.nn.actor_critic.GaussianActorNet`.

    Args:
        obs_dim: observation size.
        action_dim: action size ``A``.
        num_options: ``K``.
        hidden_sizes: hidden widths of the shared trunk.

    Shapes:
        input ``[..., obs_dim]``; outputs ``loc [..., K, A]`` and ``scale [..., K, A]`` (positive).
    """

    def __init__(self, obs_dim: int, action_dim: int, num_options: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.num_options, self.action_dim = num_options, action_dim
        self.net = mlp_head(obs_dim, num_options * 2 * action_dim, hidden_sizes)

    def forward(self, observation: Tensor) -> tuple[Tensor, Tensor]:
        out = self.net(observation).unflatten(-1, (self.num_options, 2 * self.action_dim))
        loc, log_std = out.chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1.0)
        return loc, log_std.exp()


class OptionCategoricalActorNet(nn.Module):
    """Observation -> action logits for each of the ``K`` options (discrete actions).

    Shapes:
        input ``[..., obs_dim]``; output ``[..., K, n_actions]``.
    """

    def __init__(self, obs_dim: int, n_actions: int, num_options: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.num_options, self.n_actions = num_options, n_actions
        self.net = mlp_head(obs_dim, num_options * n_actions, hidden_sizes)

    def forward(self, observation: Tensor) -> Tensor:
        return self.net(observation).unflatten(-1, (self.num_options, self.n_actions))


class OptionQNet(nn.Module):
    """``Q(s, ω, a)`` for continuous actions and every option ``ω`` at once.

    Shapes:
        inputs ``observation [..., obs_dim]`` and ``action [..., A]``; output ``[..., K]``.
    """

    def __init__(self, obs_dim: int, action_dim: int, num_options: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp_head(obs_dim + action_dim, num_options, hidden_sizes)

    def forward(self, observation: Tensor, action: Tensor) -> Tensor:
        return self.net(torch.cat([observation, action], dim=-1))


class OptionDiscreteQNet(nn.Module):
    """``Q(s, ω, ·)`` for discrete actions: one value per option and action.

    Shapes:
        input ``observation [..., obs_dim]``; output ``[..., K, n_actions]``.
    """

    def __init__(self, obs_dim: int, n_actions: int, num_options: int, hidden_sizes: Sequence[int]) -> None:
        super().__init__()
        self.num_options, self.n_actions = num_options, n_actions
        self.net = mlp_head(obs_dim, num_options * n_actions, hidden_sizes)

    def forward(self, observation: Tensor) -> Tensor:
        return self.net(observation).unflatten(-1, (self.num_options, self.n_actions))


class TerminationNet(nn.Module):
    """Observation -> the termination logits of every option; ``β(s, ω) = sigmoid(logit)``.

    Args:
        obs_dim: observation size.
        num_options: ``K``.
        hidden_sizes: hidden widths.
        init_prob: the termination probability the output bias starts at (the last layer's weights are
            scaled down, so every option starts near it in every state).

    Shapes:
        input ``[..., obs_dim]``; output ``[..., K]`` (logits).
    """

    def __init__(
        self, obs_dim: int, num_options: int, hidden_sizes: Sequence[int], init_prob: float = 0.5
    ) -> None:
        super().__init__()
        if not 0.0 < init_prob < 1.0:
            raise ValueError(f"init_prob={init_prob} must lie in (0, 1).")
        self.net = mlp_head(obs_dim, num_options, hidden_sizes)
        last = self.net[-1]
        with torch.no_grad():
            last.weight.mul_(0.1)
            last.bias.fill_(float(torch.logit(torch.tensor(init_prob))))

    def forward(self, observation: Tensor) -> Tensor:
        return self.net(observation)
