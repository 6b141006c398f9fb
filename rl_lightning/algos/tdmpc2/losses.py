"""TD-MPC2's training objectives over a horizon-H sub-trajectory, and its optimizer parameter groups.

TorchRL ships no TD-MPC2 loss: the objective couples a latent rollout (joint-embedding consistency) with
two-hot reward/value regression and a scaled policy objective, none of which ``LossModule`` subclasses
model. The functions here compute losses only; the caller owns ``backward``, gradient clipping (20 in
the reference), optimizer steps and the target update, so that one ``update`` can be compiled whole::

    batch = batch_from_tensordict(td)                     # td: [B, H] slices from a SliceSampler
    out = loss_fn.model_loss(model, batch)
    out.loss.backward(); clip_grad_norm_(model.parameters(), 20); optim.step(); optim.zero_grad()
    pi_loss, pi_metrics = loss_fn.policy_loss(model, out.zs.detach())
    pi_loss.backward(); clip_grad_norm_(model.pi_net.parameters(), 20); pi_optim.step(); pi_optim.zero_grad()
    model.soft_update_target_Q()
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import Tensor, nn

from rl_lightning.algos.hparams import HParams
from rl_lightning.algos.tdmpc2 import math as tdm
from rl_lightning.algos.tdmpc2.world_model import WorldModel

__all__ = [
    "LossSettings",
    "ModelLossOutput",
    "TDMPC2Batch",
    "TDMPC2Loss",
    "batch_from_tensordict",
    "model_param_groups",
]


class TDMPC2Batch(NamedTuple):
    """Time-major sub-trajectories (H steps, B sequences).

    Attributes:
        obs: observations ``o_0 … o_H``, ``[H+1, B, obs_dim]``.
        action: actions ``a_0 … a_{H-1}``, ``[H, B, A]``.
        reward: rewards ``r_t`` of taking ``a_t`` in ``o_t``, ``[H, B, 1]``.
        terminated: 1.0 where ``o_{t+1}`` is terminal, ``[H, B, 1]`` (zeros for non-episodic tasks).
    """

    obs: Tensor
    action: Tensor
    reward: Tensor
    terminated: Tensor


def batch_from_tensordict(td: TensorDictBase) -> TDMPC2Batch:
    """Converts TorchRL slices to a :class:`TDMPC2Batch`.

    Args:
        td: batch shape ``[B, H]`` (e.g. a ``SliceSampler`` sample reshaped to ``(B, H)``) with keys
            ``observation``, ``action``, ``("next", "observation")``, ``("next", "reward")`` and
            optionally ``("next", "terminated")``. Each slice must lie inside one episode.

    Returns:
        The time-major batch; ``o_{t+1}`` is taken from ``("next", "observation")`` so it is the true
        successor even where an auto-resetting collector wrote the reset observation into the next row.
    """
    obs = torch.cat([td["observation"][:, :1], td["next", "observation"]], dim=1)
    reward = td["next", "reward"]
    terminated = td.get(("next", "terminated"), None)
    terminated = torch.zeros_like(reward) if terminated is None else terminated.to(reward.dtype)
    return TDMPC2Batch(
        obs=obs.transpose(0, 1),
        action=td["action"].transpose(0, 1),
        reward=reward.reshape(*reward.shape[:2], 1).transpose(0, 1),
        terminated=terminated.reshape(*reward.shape[:2], 1).transpose(0, 1),
    )


class ModelLossOutput(NamedTuple):
    """Result of :meth:`TDMPC2Loss.model_loss`.

    Attributes:
        loss: weighted total, a scalar to call ``backward`` on.
        zs: latent rollout ``z_0`` (encoded) and ``z_1 … z_H`` (predicted), ``[H+1, B, latent]``; detach
            it before the policy loss.
        metrics: detached scalars keyed ``consistency_loss``, ``reward_loss``, ``value_loss``,
            ``termination_loss``, ``total_loss``.
    """

    loss: Tensor
    zs: Tensor
    metrics: dict[str, Tensor]


@dataclass(frozen=True, kw_only=True)
class LossSettings(HParams):
    """The weights of TD-MPC2's objectives (the reference's defaults); the module's ``algo.*`` keys of the
    same names, passed down to :class:`TDMPC2Loss`.

    Attributes:
        rho: temporal weight decay.
        consistency_coef: weight of the consistency loss.
        reward_coef: weight of the reward loss.
        value_coef: weight of the value loss.
        termination_coef: weight of the termination loss.
        entropy_coef: policy entropy bonus (with ``target_entropy``: its starting value).
        scale_entropy_by_action_dim: multiply the entropy by the action size; later reference versions
            do this so that one coefficient suits different action spaces. Off by default (the paper).
        target_entropy: learn the entropy coefficient towards this entropy (summed over the action
            dimensions, tanh-corrected: SAC's ``-|A|`` is the usual choice); ``None`` keeps it fixed.
    """

    rho: float = 0.5
    consistency_coef: float = 20.0
    reward_coef: float = 0.1
    value_coef: float = 0.1
    termination_coef: float = 1.0
    entropy_coef: float = 1e-4
    scale_entropy_by_action_dim: bool = False
    target_entropy: float | None = None

    def __post_init__(self) -> None:
        if self.target_entropy is not None and self.entropy_coef <= 0:
            raise ValueError(
                f"entropy_coef={self.entropy_coef} starts the learned coefficient of target_entropy: "
                "make it > 0."
            )


class TDMPC2Loss(nn.Module):
    """World-model and policy objectives of TD-MPC2 (defaults are the reference's).

    World model (one step of the reference's ``_update``): with ``z_0 = enc(o_0)`` and
    ``z_{t+1} = d(z_t, a_t)``, each term is weighted by ``rho**t`` and averaged over the horizon:

    - consistency: ``MSE(z_{t+1}, sg(enc(o_{t+1})))``;
    - reward: soft cross-entropy of the reward logits at ``(z_t, a_t)`` against two-hot ``r_t``;
    - value: soft cross-entropy of every Q-head at ``(z_t, a_t)`` against the TD target
      ``r_t + γ (1 - term_t) min_{2 random target heads} Q(z'_{t+1}, π(z'_{t+1}))`` with
      ``z'_{t+1} = enc(o_{t+1})`` (averaged over heads as well);
    - termination (``model.episodic`` only): BCE of the termination logit of ``z_{t+1}``, averaged
      uniformly over time as in the reference.

    Policy: ``mean_t rho**t * mean_B -(entropy_coef * H[π](z_t) + Q(z_t, π(z_t)) / S)`` over the detached
    rollout, with ``Q`` the average of two random heads with detached parameters and ``S`` the
    :class:`~rl_lightning.algos.tdmpc2.math.RunningScale` (updated from ``t = 0`` values, as in the
    reference).

    With ``target_entropy`` the entropy coefficient is learned instead, as SAC learns its temperature:
    ``log_entropy_coef`` (starting at ``log(entropy_coef)``) minimises ``log_entropy_coef * (H - target)``
    with ``H`` the batch's mean one-sample entropy. The reference's fixed 1e-4 suits a prior that only seeds
    the planner, whose own sampling explores; a prior that acts alone (``mpc=False``) collapses onto
    saturated, near-deterministic actions under it (entropy about -15 for hockey's 4 actions, where SAC
    keeps -4) and explores little.

    Args:
        discount: γ; see :func:`~rl_lightning.algos.tdmpc2.math.discount_from_episode_length`.
        settings: the objectives' weights (:class:`LossSettings`; its fields are read as the loss's
            attributes of the same names).
        scale_tau: EMA rate of the running Q scale.
    """

    def __init__(
        self, discount: float, settings: LossSettings | None = None, scale_tau: float = 0.01
    ) -> None:
        super().__init__()
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount={discount} must lie in (0, 1].")
        s = self.settings = LossSettings() if settings is None else settings
        self.discount, self.rho = discount, s.rho
        self.consistency_coef, self.reward_coef, self.value_coef = (
            s.consistency_coef,
            s.reward_coef,
            s.value_coef,
        )
        self.termination_coef, self.entropy_coef = s.termination_coef, s.entropy_coef
        self.scale_entropy_by_action_dim = s.scale_entropy_by_action_dim
        self.scale = tdm.RunningScale(tau=scale_tau)
        self.target_entropy = s.target_entropy
        if s.target_entropy is not None:
            self.log_entropy_coef = nn.Parameter(torch.tensor(math.log(s.entropy_coef)))

    def _rho_weights(self, steps: int, like: Tensor) -> Tensor:
        return self.rho ** torch.arange(steps, device=like.device, dtype=like.dtype)

    @torch.no_grad()
    def td_target(self, model: WorldModel, next_z: Tensor, reward: Tensor, terminated: Tensor) -> Tensor:
        """TD target ``r + γ (1 - term) Q_target_min(z', π(z'))``; shapes ``[..., latent]``, ``[..., 1]``."""
        q = model.Q(next_z, model.pi(next_z).action, return_type="min", target=True)
        return reward + self.discount * (1 - terminated) * q

    def model_loss(self, model: WorldModel, batch: TDMPC2Batch) -> ModelLossOutput:
        """World-model loss of one batch (see the class docstring).

        Args:
            model: the world model; put it in train mode first for the reference's Q dropout.
            batch: :class:`TDMPC2Batch` with horizon ``H = batch.action.shape[0]``.

        Returns:
            :class:`ModelLossOutput`.
        """
        obs, action, reward, terminated = batch
        horizon = action.shape[0]
        bins = (model.num_bins, model.vmin, model.vmax)
        with torch.no_grad():
            next_z = model.encode(obs[1:])
            td_targets = self.td_target(model, next_z, reward, terminated)

        z = model.encode(obs[0])
        zs = [z]
        for t in range(horizon):  # the rollout is sequential; the horizon is a static Python int
            z = model.next(z, action[t])
            zs.append(z)
        zs_t = torch.stack(zs)
        rho = self._rho_weights(horizon, reward)

        consistency = ((zs_t[1:] - next_z).pow(2).mean(dim=(1, 2)) * rho).sum() / horizon
        reward_ce = tdm.soft_ce(model.reward(zs_t[:-1], action), reward, *bins)
        reward_loss = (reward_ce.mean(dim=(1, 2)) * rho).sum() / horizon
        q_logits = model.Q(zs_t[:-1], action, return_type="all")  # [num_q, H, B, bins]
        value_ce = tdm.soft_ce(q_logits, td_targets.unsqueeze(0), *bins)
        value_loss = (value_ce.mean(dim=(2, 3)).sum(0) * rho).sum() / (horizon * model.num_q)
        total = (
            self.consistency_coef * consistency
            + self.reward_coef * reward_loss
            + self.value_coef * value_loss
        )
        if model.episodic:
            termination_loss = F.binary_cross_entropy_with_logits(
                model.termination_logits(zs_t[1:]), terminated
            )
            total = total + self.termination_coef * termination_loss
        else:
            termination_loss = torch.zeros_like(total)
        metrics = {
            "consistency_loss": consistency.detach(),
            "reward_loss": reward_loss.detach(),
            "value_loss": value_loss.detach(),
            "termination_loss": termination_loss.detach(),
            "total_loss": total.detach(),
        }
        return ModelLossOutput(total, zs_t, metrics)

    def policy_loss(self, model: WorldModel, zs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """Policy-prior loss; updates the running Q scale in place.

        Args:
            model: the world model.
            zs: detached latents ``[T, B, latent]`` (``ModelLossOutput.zs.detach()``).

        Returns:
            ``(loss, metrics)``; only ``model.pi_net`` (and ``log_entropy_coef``, with ``target_entropy``)
            receives gradients. Metrics: ``pi_loss``, ``pi_entropy``, ``pi_scale``, ``pi_log_std``,
            ``pi_entropy_coef``.
        """
        out = model.pi(zs)
        q = model.Q(zs, out.action, return_type="avg", detach=True)
        self.scale.update(q[0])
        q = self.scale(q)
        entropy = out.entropy * (model.action_dim if self.scale_entropy_by_action_dim else 1.0)
        rho = self._rho_weights(zs.shape[0], q)
        if self.target_entropy is None:
            coef, coef_loss = q.new_full((), self.entropy_coef), None
        else:  # SAC's temperature loss, reaching the coefficient only
            coef = self.log_entropy_coef.detach().exp()
            coef_loss = self.log_entropy_coef * (out.entropy.detach().mean() - self.target_entropy)
        pi_loss = (-(coef * entropy + q).mean(dim=(1, 2)) * rho).mean()
        loss = pi_loss if coef_loss is None else pi_loss + coef_loss
        metrics = {
            "pi_loss": pi_loss.detach(),
            "pi_entropy": out.entropy.detach().mean(),
            "pi_scale": self.scale.value.detach().squeeze(0),
            "pi_log_std": out.log_std.detach().mean(),
            "pi_entropy_coef": coef,
        }
        return loss, metrics


def model_param_groups(model: WorldModel, lr: float = 3e-4, enc_lr_scale: float = 0.3) -> list[dict]:
    """Parameter groups of the world-model optimizer (everything except the policy and the target).

    Args:
        model: the world model.
        lr: learning rate.
        enc_lr_scale: encoder learning-rate multiplier (0.3 in the reference).

    Returns:
        Groups for ``torch.optim.Adam``: the encoder at ``lr * enc_lr_scale``; dynamics, reward, Q-heads
        (and termination) at ``lr``.
    """
    rest = [*model.dynamics.parameters(), *model.reward_net.parameters(), *model.q_nets.parameters()]
    if model.termination_net is not None:
        rest += list(model.termination_net.parameters())
    return [{"params": list(model.encoder.parameters()), "lr": lr * enc_lr_scale}, {"params": rest, "lr": lr}]
