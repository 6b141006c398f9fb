"""C51: categorical distributional DQN (Bellemare et al. 2017), and with flags the Rainbow agent.

Rainbow (Hessel et al. 2018) is C51 with ``noisy``, ``dueling`` and ``double_dqn`` on, prioritized replay
and n-step returns (``replay.prioritized=true replay.n_step=3``): the ``rainbow_cartpole`` experiment.

Why not TorchRL's ``DistributionalDQNLoss``: its forward reads the support's bounds with ``.item()``,
moves the projection to the CPU, checks ``isfinite`` with a Python ``if`` and fixes the ``l == u`` case with
boolean-mask assignments, so every update synchronizes the host and cannot be captured as a CUDA graph;
it also always uses double-Q action selection and has no switch for noisy layers. The projection here
(:func:`~rl_lightning.algos.quantile.math.categorical_projection`) computes the same target with static
shapes on the device; ``tests/algos/test_quantile_algos.py`` checks that both give the same loss.
"""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import TensorSpec

from rl_lightning.algos.hparams import shares
from rl_lightning.algos.quantile.math import categorical_projection
from rl_lightning.algos.quantile.module import td_discount
from rl_lightning.algos.value_based import ValueBased, ValueBasedHParams
from rl_lightning.nn.quantile import DistributionalQNet

__all__ = ["C51"]


class _ExpectedReturn(nn.Module):
    """``observation -> Q(s, a) = sum_k softmax_k z_k`` ``[N, A]`` of the noise-free network (for export)."""

    support: Tensor

    def __init__(self, net: nn.Module, support: Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("support", support)

    def forward(self, observation: Tensor) -> Tensor:
        return torch.log_softmax(self.net(observation, False).float(), dim=-1).exp() @ self.support


@shares(ValueBasedHParams)
class C51(ValueBased):
    """Categorical DQN: a distribution over ``n_atoms`` fixed returns per action, cross-entropy to the
    projected Bellman target.

    The network outputs logits ``[B, A, K]``; :math:`p(s, a) = \\mathrm{softmax}_k`, :math:`Q(s, a) =
    \\sum_k p_k(s, a) z_k`. The target for a transition is :math:`m = \\Phi \\hat{T} Z(s', a^*)` with
    :math:`a^* = \\arg\\max_a Q(s', a)` (the target net's Q, or the online net's with ``double_dqn``),
    :math:`\\hat{T} z = r + \\gamma^n (1 - d) z`, and the loss :math:`-\\sum_k m_k \\log p_k(s, a)`.

    Args:
        observation_spec: env observation spec.
        action_spec: env action spec; must be discrete.
        n_atoms: atoms of the support (51 in the paper).
        v_min: the smallest return of the support.
        v_max: the largest return of the support.
        noisy: noisy layers in the head (exploration by parameter noise; set ``eps_*`` to 0 with it).
        noisy_std: :math:`\\sigma_0` of the noisy layers.
        **shared: the family's hyperparameters (:class:`~rl_lightning.algos.value_based.ValueBasedHParams`;
            ``hidden_sizes``: the trunk, then the head's hidden layer; ``dueling``: per atom, on the logits).
    """

    support: Tensor

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        n_atoms: int = 51,
        v_min: float = -10.0,
        v_max: float = 10.0,
        noisy: bool = False,
        noisy_std: float = 0.5,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, **shared)
        if n_atoms < 2 or not v_min < v_max:
            raise ValueError(f"C51 needs algo.n_atoms >= 2 and algo.v_min < algo.v_max, got {n_atoms}, "
                             f"{v_min}, {v_max}.")  # fmt: skip
        self.noisy = noisy
        self.register_buffer("support", torch.linspace(v_min, v_max, n_atoms))
        self.build(
            lambda f: DistributionalQNet(
                f, self.hidden_sizes, self.n_actions, n_atoms, self.config.dueling, noisy, noisy_std
            )
        )

    def log_probs(self, observation: Tensor, noisy: bool = True, target: bool = False) -> Tensor:
        """Log-probabilities ``[B, A, K]`` of the atoms, per action."""
        net = self.target if target else self.online
        return torch.log_softmax(net(observation, noisy).float(), dim=-1)

    def q_values(self, observation: Tensor, explore: bool = True) -> Tensor:
        """:math:`Q(s, a) = \\sum_k p_k(s, a) z_k`, ``[B, A]`` (noisy layers on when exploring)."""
        return self.log_probs(observation, explore).exp() @ self.support

    def eval_q(self) -> nn.Module:
        return _ExpectedReturn(self.online, self.support)

    def per_sample_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """Cross-entropy to the projected target per transition ``[B]``, also the new priorities (Rainbow's
        choice); ``q_mean``, the mean Q of the taken actions."""
        obs = batch.get("observation").float()
        next_obs = batch.get(("next", "observation")).float()
        action = batch.get("action").reshape(-1, 1, 1).long()
        reward, discount = td_discount(batch, self.config.gamma)
        log_p = self.log_probs(obs).gather(-2, action.expand(-1, 1, self.hparams.n_atoms)).squeeze(-2)
        with torch.no_grad():
            next_p = self.log_probs(next_obs, target=True).exp()  # [B, A, K]
            chooser = self.log_probs(next_obs).exp() if self.config.double_dqn else next_p
            next_a = (chooser @ self.support).argmax(-1)  # [B]
            next_pa = next_p.gather(-2, next_a.reshape(-1, 1, 1).expand(-1, 1, self.hparams.n_atoms))
            m = categorical_projection(next_pa.squeeze(-2), reward, discount, self.support)
        loss = -(m * log_p).sum(-1)
        return loss, loss, {"q_mean": (log_p.detach().exp() @ self.support).mean()}
