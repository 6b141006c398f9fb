"""Actor and critic networks of the actor-critic family (SAC, discrete SAC, TD3, DDPG).

Plain ``nn.Module`` MLPs, so that the algorithms can call them directly on their hot paths (acting) and
wrap them as TensorDict modules for TorchRL's losses. Actions are in ``[-1, 1]`` on the network side;
the algorithms map them to the env's bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_lightning.nn.layers import ensemble_mlp, relu_after_linear

__all__ = [
    "DeterministicActorNet",
    "EnsembleQNet",
    "GaussianActorNet",
    "QNet",
    "ReLUMLP",
    "TanhMean",
    "mlp_head",
    "safe_tanh",
    "tanh_normal_rsample",
]

#: Range of the Gaussian actor's log standard deviation (as in CleanRL's SAC and the SAC reference code).
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


class ReLUMLP(nn.Sequential):
    """The ``nn.Sequential`` of :func:`mlp_head`: ``Linear`` layers with ``ReLU`` between, evaluated as one
    module.

    Its forward calls ``F.linear`` and ``torch.relu`` on the layers' parameters directly, without a
    module call per layer: a module call is a few microseconds of Python, as much as a linear layer of
    one observation on a CPU (DQN's CartPole ``act`` with a ``[256, 256]`` Q-network 53.8 -> 46.5 us). The
    same ops in the same order: the same values and gradients. The layers' own forward hooks are therefore
    not called; the MLP's are (hook the MLP itself). A layer of any other type (added or swapped in later)
    is called as a module.

    A ReLU right after a linear layer works in place on that layer's output (:func:`relu_after_linear`).
    """

    def forward(self, x: Tensor) -> Tensor:
        fresh = False  # whether x is a linear layer's output made in this call
        for layer in self:
            if type(layer) is nn.Linear:
                x, fresh = F.linear(x, layer.weight, layer.bias), True
            elif type(layer) is nn.ReLU:
                x, fresh = relu_after_linear(x, fresh), False
            else:
                x, fresh = layer(x), False
        return x


def mlp_head(in_features: int, out_features: int, hidden_sizes: Sequence[int]) -> ReLUMLP:
    """A ReLU MLP ``[..., in_features] -> [..., out_features]`` with a linear last layer.

    The layers, the initialisation and the parameter names of TorchRL's ``MLP`` (``0.weight``,
    ``2.weight``, ...), without its per-call input handling: a :class:`ReLUMLP`.
    """
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return ReLUMLP(*layers, nn.Linear(in_features, out_features))


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


class EnsembleQNet(nn.Module):
    """``E`` critics ``Q_i(s, a)`` (each a :class:`QNet`) evaluated as one batched MLP.

    Parameters ``net.{2 i}.weight [E, out, in]`` and ``net.{2 i}.bias [E, out]``: the :class:`QNet`
    parameters of the members, stacked (see :func:`~rl_lightning.nn.layers.ensemble_mlp`).

    Shapes:
        inputs ``observation [B, obs_dim]`` and ``action [B, A]``; output ``[E, B, 1]``.
    """

    def __init__(self, obs_dim: int, action_dim: int, hidden_sizes: Sequence[int], size: int) -> None:
        super().__init__()
        self.net = ensemble_mlp(obs_dim + action_dim, hidden_sizes, 1, size)

    def forward(self, observation: Tensor, action: Tensor, detach: bool = False) -> Tensor:
        """``detach``: detached parameters (the actor loss's critics: gradients reach the action only)."""
        return self.net(torch.cat([observation, action], dim=-1), detach=detach)


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


def safe_tanh(x: Tensor) -> Tensor:
    """TorchRL's ``safetanh_noeps`` (the squashing of its ``TanhNormal``) with ordinary ops: the same values
    and gradients, bit for bit, without a Python autograd function.

    The value is ``tanh(x)`` clamped into ``[-l, l]``, ``l = 1 - resolution`` of the dtype (so that the
    inverse stays finite); the gradient is ``1 - y ** 2`` of the clamped value ``y``, which stays positive
    where the clamp bites. Here ``y`` is computed without autograd and the gradient enters through
    ``(x - x.detach()) * (1 - y ** 2)``, which is zero in value: its derivative is the same product
    TorchRL's backward computes. The autograd function's apply, context and backward call cost 36 us of a
    forward and backward of SAC's ``[256, 1]`` actions and 15 us of a call without gradients on a CPU.
    """
    lim = 1.0 - torch.finfo(x.dtype).resolution
    value = x.detach()
    y = torch.tanh(value).clamp_(-lim, lim)
    if not torch.is_grad_enabled():
        return y
    return y + (x - value) * (1 - y.pow(2))


def tanh_normal_rsample(loc: Tensor, scale: Tensor, common_noise: bool = False) -> tuple[Tensor, Tensor]:
    """A reparameterised tanh-Gaussian sample and its log-probability, as TorchRL's ``TanhNormal``.

    The same formulas and the same random draw as TorchRL's ``TanhNormal.rsample_and_log_prob`` (the
    distribution of ``SACLoss``): the pre-tanh value ``x = loc + ε·scale`` with ``ε ~ N(0, 1)``, scored
    on ``x`` itself (not on the inverse tanh of the rounded action), minus the tanh Jacobian
    ``log|d tanh(x)/dx| = 2 (log 2 - x - softplus(-2x))``.

    With ``common_noise`` the options (dimension ``-2``) share one ``ε`` per state (common random
    numbers): each option's sample is still exact, but the options' sampled values ``Q_Ω(s, ·)`` differ
    only where the options do. With independent noise, the softmax weights of ``V_Ω`` follow the noise,
    ``V_Ω`` sits above a typical option's ``Q_Ω``, and the termination gradient, seeing ``A_Ω < -ξ``
    everywhere, drives every ``β`` to 1 (measured on Pendulum: options of one step after 3k frames). With
    one option the draw is the same as without sharing.

    Args:
        loc: ``[..., K, A]`` pre-tanh means (any ``[..., A]`` without ``common_noise``).
        scale: standard deviations, the shape of ``loc``.
        common_noise: one ``ε`` for all options of a state.

    Returns:
        ``action`` (the shape of ``loc``) in ``(-1, 1)`` and ``log_prob`` (summed over ``A``).
    """
    eps = torch.randn_like(loc[..., :1, :]).expand_as(loc) if common_noise else torch.randn_like(loc)
    x = loc + eps * scale
    action = safe_tanh(x)
    normal = -((x - loc) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_2PI
    log_det = 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))
    return action, normal.sum(-1) - log_det.sum(-1)
