"""IQN: implicit quantile networks (Dabney, Ostrovski, Silver & Munos 2018), with risk-sensitive acting.

TorchRL has no IQN loss (its distributional loss is C51's categorical one); the loss is
:func:`~rl_lightning.algos.quantile.math.quantile_huber_loss` on sampled fractions.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import TensorSpec

from rl_lightning.algos.hparams import shares
from rl_lightning.algos.quantile.math import check_risk, distort, midpoint_fractions, quantile_huber_loss
from rl_lightning.algos.quantile.module import td_discount
from rl_lightning.algos.value_based import ValueBased, ValueBasedHParams
from rl_lightning.nn.encoders import EncodedNet
from rl_lightning.nn.quantile import ImplicitQuantileNet

__all__ = ["IQN"]


class _FixedFractionMean(nn.Module):
    """``observation -> (1/K) sum_k Z_{tau_k}(s, a)`` ``[N, A]`` at fixed fractions ``tau [K]`` (already
    distorted), noise-free network: IQN's evaluation estimate (for export)."""

    tau: Tensor

    def __init__(self, net: nn.Module, tau: Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("tau", tau)

    def forward(self, observation: Tensor) -> Tensor:
        tau = self.tau.expand(observation.shape[0], -1)
        return self.net(observation, tau, False).float().mean(-2)


@shares(ValueBasedHParams)
class IQN(ValueBased):
    """The quantile function :math:`Z_\\tau(s, a)` for any fraction :math:`\\tau`, learnt from samples.

    Per update: ``N`` fractions :math:`\\tau_i \\sim U[0, 1]` for the prediction, ``N'`` fractions
    :math:`\\tau'_j` for the target :math:`y_j = r + \\gamma^n (1 - d) Z'_{\\tau'_j}(s', a^*)`, with
    :math:`a^* = \\arg\\max_a \\frac1K \\sum_k Z_{\\beta(\\tilde\\tau_k)}(s', a)` (the target net, or the
    online net with ``double_dqn``) and loss :math:`\\sum_i \\frac1{N'} \\sum_j
    \\rho^\\kappa_{\\tau_i}(y_j - Z_{\\tau_i}(s, a))` (Algorithm 1 of the paper).

    Acting maximises the distorted expectation :math:`\\frac1K \\sum_k Z_{\\beta(\\tilde\\tau_k)}(s, a)`
    for the distortion :math:`\\beta` of ``risk`` (see :mod:`rl_lightning.algos.quantile.math`): the
    exploring policy draws :math:`\\tilde\\tau_k \\sim U[0, 1]` as in the paper, the evaluation policy uses
    the fixed midpoints :math:`(2k - 1)/(2K)`, so it is deterministic; both apply :math:`\\beta`.

    Args:
        observation_spec: env observation spec.
        action_spec: env action spec; must be discrete.
        n_cos: cosine basis functions of the fraction embedding (64 in the paper).
        n_quantiles: ``N``, fractions per prediction (64 in the paper).
        n_target_quantiles: ``N'``, fractions per target (64 in the paper).
        n_policy_quantiles: ``K``, fractions per action choice (32 in the paper).
        kappa: Huber threshold of the quantile loss (1 in the paper).
        risk: the distortion of acting: ``neutral``, ``cvar``, ``wang``, ``cpw`` or ``pow``.
        risk_param: its :math:`\\eta` (CVaR's tail fraction, Wang's shift, CPW's and Pow's exponent).
        noisy: noisy layers in the head.
        noisy_std: :math:`\\sigma_0` of the noisy layers.
        **shared: the family's hyperparameters (:class:`~rl_lightning.algos.value_based.ValueBasedHParams`).
            ``hidden_sizes``: the state trunk :math:`\\psi` (its last width is the embedding width), then the
            head's hidden layer: at least two widths on vector observations; with an image encoder, which is
            then :math:`\\psi` (its features the embedding width), one. The paper's ``adam_eps`` is
            ``0.01 / 32``.
    """

    policy_fractions: Tensor
    #: ``act`` and ``act_eval`` follow ``risk``: ``evaluate risk=...`` may change it on a trained checkpoint.
    acts_with_risk: ClassVar[bool] = True

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        n_cos: int = 64,
        n_quantiles: int = 64,
        n_target_quantiles: int = 64,
        n_policy_quantiles: int = 32,
        kappa: float = 1.0,
        risk: str = "neutral",
        risk_param: float = 0.0,
        noisy: bool = False,
        noisy_std: float = 0.5,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, **shared)
        if min(n_quantiles, n_target_quantiles, n_policy_quantiles) < 1 or kappa <= 0:
            raise ValueError(
                "IQN needs algo.n_quantiles, n_target_quantiles, n_policy_quantiles >= 1 and kappa > 0."
            )
        check_risk(risk, risk_param)
        self.noisy = noisy
        self.register_buffer("policy_fractions", midpoint_fractions(n_policy_quantiles))
        hidden = self.hidden_sizes
        self.build(
            lambda f: ImplicitQuantileNet(
                f, hidden, self.n_actions, n_cos, self.config.dueling, noisy, noisy_std
            )
        )
        if len(hidden) < 2 and not isinstance(self.online, EncodedNet):
            raise ValueError(
                f"algo.hidden_sizes={hidden}: IQN on vector observations needs at least two widths (the "
                "state trunk, then the head); with an image encoder one (the head) is enough."
            )

    def distort(self, tau: Tensor) -> Tensor:
        """The acting distortion :math:`\\beta(\\tau)` of ``risk`` and ``risk_param``."""
        return distort(tau, self.hparams.risk, self.hparams.risk_param)

    def quantiles(self, observation: Tensor, tau: Tensor, noisy: bool = True, target: bool = False) -> Tensor:
        """:math:`Z_\\tau(s, a)`, ``[B, N, A]``, for observations ``[B, obs_dim]``, fractions ``[B, N]``."""
        net = self.target if target else self.online
        return net(observation, tau, noisy).float()

    def policy_tau(self, batch: int, device: torch.device, explore: bool) -> Tensor:
        """The ``K`` distorted fractions of acting, ``[batch, K]``: sampled (explore) or the fixed grid."""
        if explore:
            tau = torch.rand(batch, self.hparams.n_policy_quantiles, device=device)
        else:
            tau = self.policy_fractions.expand(batch, -1)
        return self.distort(tau)

    def distorted_q(self, observation: Tensor, noisy: bool, explore: bool, target: bool = False) -> Tensor:
        """:math:`\\frac1K \\sum_k Z_{\\beta(\\tilde\\tau_k)}(s, a)`, ``[B, A]``."""
        tau = self.policy_tau(observation.shape[0], observation.device, explore)
        return self.quantiles(observation, tau, noisy, target).mean(-2)

    def q_values(self, observation: Tensor, explore: bool = True) -> Tensor:
        """The distorted mean of :meth:`distorted_q`: sampled fractions and noise when exploring, else the
        fixed grid without noise."""
        return self.distorted_q(observation, explore, explore)

    def eval_q(self) -> nn.Module:
        """The distorted mean over the fixed grid, as ``act_eval`` computes it (the distortion, a function of
        the grid alone, is applied here once: the exported file holds the distorted fractions)."""
        return _FixedFractionMean(self.online, self.distort(self.policy_fractions).detach().clone())

    def per_sample_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Quantile Huber loss per transition ``[B]`` on sampled fractions, also the new priorities;
        ``q_mean``, the mean Q of the taken actions."""
        hp, cfg = self.hparams, self.config
        obs = batch.get("observation").float()
        next_obs = batch.get(("next", "observation")).float()
        b = obs.shape[0]
        action = batch.get("action").reshape(-1, 1, 1).long()
        reward, discount = td_discount(batch, cfg.gamma)
        tau = torch.rand(b, hp.n_quantiles, device=obs.device)
        pred = self.quantiles(obs, tau).gather(-1, action.expand(-1, hp.n_quantiles, 1)).squeeze(-1)  # [B, N]
        with torch.no_grad():
            chooser = self.distorted_q(next_obs, noisy=True, explore=True, target=not cfg.double_dqn)
            next_a = chooser.argmax(-1)
            tau_next = torch.rand(b, hp.n_target_quantiles, device=obs.device)
            next_z = self.quantiles(next_obs, tau_next, target=True)  # [B, N', A]
            next_z = next_z.gather(-1, next_a.reshape(-1, 1, 1).expand(-1, hp.n_target_quantiles, 1))
            target = reward + discount * next_z.squeeze(-1)
        loss = quantile_huber_loss(pred, target, tau, hp.kappa)
        return loss, loss, {"q_mean": pred.detach().mean()}
