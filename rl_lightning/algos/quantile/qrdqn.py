"""QR-DQN: quantile regression DQN (Dabney et al. 2017, "Distributional Reinforcement Learning with
Quantile Regression").

TorchRL has no quantile-regression loss; the loss is :func:`~rl_lightning.algos.quantile.math.
quantile_huber_loss` on ``N`` fixed fractions.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import TensorSpec

from rl_lightning.algos.hparams import shares
from rl_lightning.algos.quantile.math import midpoint_fractions, quantile_huber_loss
from rl_lightning.algos.quantile.module import td_discount
from rl_lightning.algos.value_based import ValueBased, ValueBasedHParams
from rl_lightning.nn.quantile import DistributionalQNet

__all__ = ["QRDQN"]


class _QuantileMean(nn.Module):
    """``observation -> Q(s, a)``, the mean of the noise-free network's quantiles, ``[N, A]`` (for export)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, observation: Tensor) -> Tensor:
        return self.net(observation, False).float().mean(-1)


@shares(ValueBasedHParams)
class QRDQN(ValueBased):
    """``N`` quantiles per action at the fixed fractions :math:`\\hat\\tau_i = (2i - 1)/(2N)`.

    :math:`Q(s, a) = \\frac1N \\sum_i \\theta_i(s, a)`. Target samples
    :math:`y_j = r + \\gamma^n (1 - d)\\, \\theta'_j(s', a^*)` with :math:`a^* = \\arg\\max_a Q(s', a)` (the
    target net's Q, or the online net's with ``double_dqn``); the loss is the quantile Huber loss
    :math:`\\sum_i \\frac1N \\sum_j \\rho^\\kappa_{\\hat\\tau_i}(y_j - \\theta_i(s, a))`.

    Args:
        observation_spec: env observation spec.
        action_spec: env action spec; must be discrete.
        n_quantiles: ``N`` (200 in the paper).
        kappa: Huber threshold of the quantile loss (1 in the paper).
        noisy: noisy layers in the head.
        noisy_std: :math:`\\sigma_0` of the noisy layers.
        **shared: the family's hyperparameters (:class:`~rl_lightning.algos.value_based.ValueBasedHParams`;
            ``hidden_sizes``: the trunk, then the head's hidden layer; ``dueling``: per quantile; the paper's
            ``adam_eps`` is ``0.01 / 32``).
    """

    fractions: Tensor

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        n_quantiles: int = 200,
        kappa: float = 1.0,
        noisy: bool = False,
        noisy_std: float = 0.5,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, **shared)
        if n_quantiles < 1 or kappa <= 0:
            raise ValueError(
                f"QR-DQN needs algo.n_quantiles >= 1 and algo.kappa > 0, got {n_quantiles}, {kappa}."
            )
        self.noisy = noisy
        self.register_buffer("fractions", midpoint_fractions(n_quantiles))
        self.build(
            lambda f: DistributionalQNet(
                f, self.hidden_sizes, self.n_actions, n_quantiles, self.config.dueling, noisy, noisy_std
            )
        )

    def quantiles(self, observation: Tensor, noisy: bool = True, target: bool = False) -> Tensor:
        """Quantiles ``[B, A, N]`` at :attr:`fractions`."""
        net = self.target if target else self.online
        return net(observation, noisy).float()

    def q_values(self, observation: Tensor, explore: bool = True) -> Tensor:
        """:math:`Q(s, a) = \\frac1N \\sum_i \\theta_i(s, a)`, ``[B, A]`` (noisy layers on when exploring)."""
        return self.quantiles(observation, explore).mean(-1)

    def eval_q(self) -> nn.Module:
        return _QuantileMean(self.online)

    def per_sample_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Quantile Huber loss per transition ``[B]``, also the new priorities; ``q_mean``, the mean Q of the
        taken actions."""
        n = self.hparams.n_quantiles
        obs = batch.get("observation").float()
        next_obs = batch.get(("next", "observation")).float()
        action = batch.get("action").reshape(-1, 1, 1).long()
        reward, discount = td_discount(batch, self.config.gamma)
        pred = self.quantiles(obs).gather(-2, action.expand(-1, 1, n)).squeeze(-2)  # [B, N]
        with torch.no_grad():
            next_q = self.quantiles(next_obs, target=True)  # [B, A, N]
            chooser = self.quantiles(next_obs) if self.config.double_dqn else next_q
            next_a = chooser.mean(-1).argmax(-1).reshape(-1, 1, 1)
            target = reward + discount * next_q.gather(-2, next_a.expand(-1, 1, n)).squeeze(-2)
        loss = quantile_huber_loss(pred, target, self.fractions, self.hparams.kappa)
        return loss, loss, {"q_mean": pred.detach().mean()}
