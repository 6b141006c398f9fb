"""Networks of the distributional family: the cosine embedding of quantile fractions and the heads.

- :class:`CosineEmbedding`: IQN's embedding of a fraction :math:`\\tau` (Dabney et al. 2018, eq. 4).
- :class:`DistributionalHead`: features -> ``[..., A, K]`` (``K`` atoms or quantiles per action), plain or
  dueling, with plain or noisy layers.
- :class:`DistributionalQNet`: an MLP trunk plus a head; C51's logits and QR-DQN's quantiles.
- :class:`ImplicitQuantileNet`: :math:`Z_\\tau(x, a) = f(\\psi(x) \\odot \\phi(\\tau))_a`, IQN's network; with
  one output and ``x = (s, a)`` it is AC-IQN's critic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rl_lightning.nn.noisy import NoisyMLP

__all__ = ["CosineEmbedding", "DistributionalHead", "DistributionalQNet", "ImplicitQuantileNet", "trunk"]


def trunk(in_features: int, hidden_sizes: Sequence[int]) -> nn.Module:
    """Linear + ReLU layers of widths ``hidden_sizes`` (identity when empty): ``[..., in] -> [..., last]``."""
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [nn.Linear(in_features, width), nn.ReLU()]
        in_features = width
    return nn.Sequential(*layers) if layers else nn.Identity()


class CosineEmbedding(nn.Module):
    """IQN's fraction embedding (eq. 4 of the paper).

    :math:`\\phi_j(\\tau) = \\mathrm{ReLU}(\\sum_{i=0}^{n-1} \\cos(\\pi i \\tau) w_{ij} + b_j)`.

    Args:
        out_features: embedding width (the trunk's feature width, for the Hadamard product).
        n_cos: number of cosine basis functions ``n`` (64 in the paper).

    Shapes:
        input ``[...]`` fractions in [0, 1]; output ``[..., out_features]``.
    """

    frequencies: Tensor

    def __init__(self, out_features: int, n_cos: int = 64) -> None:
        super().__init__()
        if n_cos < 1:
            raise ValueError(f"n_cos={n_cos} must be >= 1.")
        self.register_buffer("frequencies", math.pi * torch.arange(n_cos, dtype=torch.float32))
        self.linear = nn.Linear(n_cos, out_features)

    def forward(self, tau: Tensor) -> Tensor:
        return F.relu(self.linear(torch.cos(tau.unsqueeze(-1) * self.frequencies)))


class DistributionalHead(nn.Module):
    """Features -> ``K`` outputs per action, through one hidden layer; dueling and noisy as options.

    Plain: ``out = g(h)`` reshaped to ``[..., A, K]``. Dueling (Wang et al. 2016, per atom/quantile as in
    Rainbow): ``out = V(h) + A(h) - mean_a A(h)`` with ``V: [..., 1, K]`` and ``A: [..., A, K]``.

    Args:
        in_features: feature width ``F``.
        hidden: width of the head's hidden layer (each stream's, when dueling).
        n_actions: ``A``.
        n_outputs: ``K`` (atoms of C51, quantiles of QR-DQN, 1 for IQN).
        dueling: value and advantage streams.
        noisy: noisy layers (:class:`~rl_lightning.nn.noisy.NoisyLinear`) instead of plain ones.
        std_init: :math:`\\sigma_0` of the noisy layers.

    Shapes:
        input ``[..., F]``; output ``[..., A, K]``.
    """

    def __init__(
        self,
        in_features: int,
        hidden: int,
        n_actions: int,
        n_outputs: int,
        dueling: bool = False,
        noisy: bool = False,
        std_init: float = 0.5,
    ) -> None:
        super().__init__()
        self.n_actions, self.n_outputs, self.dueling = n_actions, n_outputs, dueling
        self.advantage = NoisyMLP(in_features, [hidden], n_actions * n_outputs, noisy, std_init)
        self.value = NoisyMLP(in_features, [hidden], n_outputs, noisy, std_init) if dueling else None

    def forward(self, h: Tensor, noisy: bool = True) -> Tensor:
        out = self.advantage(h, noisy).unflatten(-1, (self.n_actions, self.n_outputs))
        if self.value is None:
            return out
        value = self.value(h, noisy).unsqueeze(-2)
        return value + out - out.mean(-2, keepdim=True)


class DistributionalQNet(nn.Module):
    """``K`` outputs per action for an observation: a trunk of ``hidden_sizes[:-1]`` and a head of
    ``hidden_sizes[-1]`` (the same layer widths as DQN's network for the same ``hidden_sizes``).

    Args:
        in_features: observation size.
        hidden_sizes: layer widths, at least one.
        n_actions: ``A``.
        n_outputs: ``K``.
        dueling: dueling head.
        noisy: noisy layers in the head (the trunk stays plain, as in Rainbow).
        std_init: :math:`\\sigma_0` of the noisy layers.

    Shapes:
        input ``[..., in_features]``; output ``[..., A, K]``.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        n_actions: int,
        n_outputs: int,
        dueling: bool = False,
        noisy: bool = False,
        std_init: float = 0.5,
    ) -> None:
        super().__init__()
        if len(hidden_sizes) < 1:
            raise ValueError("hidden_sizes needs at least one width.")
        self.trunk = trunk(in_features, hidden_sizes[:-1])
        width = hidden_sizes[-2] if len(hidden_sizes) > 1 else in_features
        self.head = DistributionalHead(
            width, hidden_sizes[-1], n_actions, n_outputs, dueling, noisy, std_init
        )

    def forward(self, x: Tensor, noisy: bool = True) -> Tensor:
        return self.head(self.trunk(x), noisy)


class ImplicitQuantileNet(nn.Module):
    """IQN's network :math:`Z_\\tau(x, \\cdot) = f(\\psi(x) \\odot \\phi(\\tau))`.

    :math:`\\psi` is a trunk of ``hidden_sizes[:-1]`` (none with one width: the input, an image encoder's
    features, is the state embedding), :math:`\\phi` a :class:`CosineEmbedding` of the same width,
    :math:`f` a :class:`DistributionalHead` with one hidden layer of ``hidden_sizes[-1]`` and one output
    per action (the multiplicative interaction of the paper, eq. 4).

    Args:
        in_features: input size (an observation; for AC-IQN's critic an observation and an action).
        hidden_sizes: at least one width.
        n_outputs: outputs per fraction (``A`` actions; 1 for a critic of ``(s, a)``).
        n_cos: cosine basis functions of the embedding.
        dueling: dueling head.
        noisy: noisy layers in the head.
        std_init: :math:`\\sigma_0` of the noisy layers.

    Shapes:
        ``x [B, in_features]``, ``tau [B, N]`` -> ``[B, N, n_outputs]``.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        n_outputs: int,
        n_cos: int = 64,
        dueling: bool = False,
        noisy: bool = False,
        std_init: float = 0.5,
    ) -> None:
        super().__init__()
        if len(hidden_sizes) < 1:
            raise ValueError("hidden_sizes needs at least one width (the head's).")
        self.psi = trunk(in_features, hidden_sizes[:-1])
        width = hidden_sizes[-2] if len(hidden_sizes) > 1 else in_features
        self.phi = CosineEmbedding(width, n_cos)
        self.head = DistributionalHead(width, hidden_sizes[-1], n_outputs, 1, dueling, noisy, std_init)

    def forward(self, x: Tensor, tau: Tensor, noisy: bool = True) -> Tensor:
        h = self.psi(x).unsqueeze(-2) * self.phi(tau)  # [B, N, F]
        return self.head(h, noisy).squeeze(-1)
