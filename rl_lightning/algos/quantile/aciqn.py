"""AC-IQN: an implicit-quantile critic with a deterministic actor, for continuous actions.

The critic is IQN's network over state-action pairs, :math:`Z_\\tau(s, a)`, trained with the quantile
Huber loss; the actor :math:`\\mu(s)` is trained, as in DDPG/TD3, to maximise the critic, here its
distorted mean :math:`\\frac1K\\sum_k Z_{\\beta(\\tilde\\tau_k)}(s, \\mu(s))` with IQN's distortion risk
measures (Dabney et al. 2018, §3.1), the way risk-sensitive distributional actor-critics such as DSAC
(Ma et al. 2020) apply them to an IQN critic.
TD3's remedies against over-estimation (Fujimoto et al. 2018) carry over: twin critics whose target
quantiles are the per-fraction minimum, target policy smoothing, and delayed actor and target updates.

TorchRL's ``TD3Loss`` regresses a scalar Q; there is no distributional actor-critic loss to reuse, so
the critic loss is :func:`~rl_lightning.algos.quantile.math.quantile_huber_loss` (shared with IQN).

The delayed actor: ``update(batch)`` is one full step (critics, actor, targets); a batch that carries the
key ``"critic_only"`` gets the critic step alone. ``prepare_sample`` marks ``policy_delay - 1`` of every
``policy_delay`` batches on the host from a Python update counter (saved in checkpoints), so no tensor is
read and no Python branch depends on a tensor value: a CUDA-graphed ``update`` has one graph per input
signature, and the compiled losses (``compile_regions``) read the batch without the mark, one variant each
(the same scheme as TD3's module).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.data import TensorSpec

from rl_lightning.algos.base import RLModule, priority_feedback
from rl_lightning.algos.common import (
    CRITIC_ONLY,
    ActionScaler,
    clip_grad_norm,
    polyak_update,
    weighted_mean,
)
from rl_lightning.algos.deterministic import DeterministicActorMixin
from rl_lightning.algos.hparams import ActorCriticHParams, save_hparams, shares, split_shared
from rl_lightning.algos.quantile.math import check_risk, distort, quantile_huber_loss
from rl_lightning.algos.quantile.module import td_discount
from rl_lightning.nn.layers import Ensemble
from rl_lightning.nn.quantile import ImplicitQuantileNet, trunk

__all__ = ["ACIQN", "CRITIC_ONLY"]

#: Checkpoint entry of the host-side update counter that schedules the delayed actor.
_COUNTER_KEY = "aciqn_updates"


@shares(ActorCriticHParams)
class ACIQN(DeterministicActorMixin, RLModule):
    """Actor-critic IQN with TD3's target smoothing, twin critics and delayed actor updates.

    Critic step, with :math:`\\tilde a' = \\mathrm{clip}(\\mu'(s') + \\mathrm{clip}(\\sigma\\epsilon, -c, c),
    -1, 1)` and fractions :math:`\\tau'_j \\sim U`: targets :math:`y_j = r + \\gamma^n (1 - d)
    \\min_k Z'^{(k)}_{\\tau'_j}(s', \\tilde a')`; each critic :math:`k` minimises
    :math:`\\sum_i \\frac1{N'}\\sum_j \\rho^\\kappa_{\\tau_i}(y_j - Z^{(k)}_{\\tau_i}(s, a))`.
    Actor step (every ``policy_delay`` critic steps): minimise
    :math:`-\\frac1K\\sum_k Z^{(1)}_{\\beta(\\tilde\\tau_k)}(s, \\mu(s))`, then Polyak-average the target
    actor and critics.

    Actions live in ``[-1, 1]`` inside the module (the actor's tanh) and are scaled to the env's bounds
    when acting; the replay holds env actions. Acting, the deterministic policy (the risk distortion
    shapes the actor's training objective only, not how it acts) and the delayed actor's schedule are
    TD3's (:class:`~rl_lightning.algos.deterministic.DeterministicActorMixin`).

    Args:
        observation_spec: env observation spec.
        action_spec: env action spec; bounded continuous.
        actor_hidden_sizes: the actor MLP's widths.
        critic_hidden_sizes: the critic's widths, at least two (state-action trunk, then the head).
        n_cos: cosine basis functions of the fraction embedding.
        num_critics: critics whose target quantiles are minimised over (2 as in TD3).
        n_quantiles: ``N``, fractions per prediction.
        n_target_quantiles: ``N'``, fractions per target.
        n_policy_quantiles: ``K``, fractions of the actor's objective.
        kappa: Huber threshold of the quantile loss.
        risk: distortion of the actor's objective: ``neutral``, ``cvar``, ``wang``, ``cpw`` or ``pow``.
        risk_param: its :math:`\\eta`.
        policy_delay: critic steps per actor step.
        exploration_noise: std of the Gaussian noise added to the actor's ``[-1, 1]`` action when exploring.
        target_noise: std :math:`\\sigma` of the target policy smoothing noise.
        target_noise_clip: its clip :math:`c`.
        **shared: :class:`~rl_lightning.algos.hparams.ActorCriticHParams` (the actor's and the critics'
            learning rates, ``gamma``, ``tau`` of the target networks at each actor step, ``grad_clip`` of
            each step).
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("critic_loss", "actor_loss")}
    ddp_find_unused_parameters = True  # the critic step's backward skips the actor; the actor's, the critics
    hp: ActorCriticHParams
    update_counter_key = _COUNTER_KEY
    actor_attribute = "actor"

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        actor_hidden_sizes: Sequence[int] = (256, 256),
        critic_hidden_sizes: Sequence[int] = (256, 256),
        n_cos: int = 64,
        num_critics: int = 2,
        n_quantiles: int = 32,
        n_target_quantiles: int = 32,
        n_policy_quantiles: int = 32,
        kappa: float = 1.0,
        risk: str = "neutral",
        risk_param: float = 0.0,
        policy_delay: int = 2,
        exploration_noise: float = 0.1,
        target_noise: float = 0.2,
        target_noise_clip: float = 0.5,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec)
        self.actions = ActionScaler(action_spec, "AC-IQN")
        (self.hp,) = split_shared(type(self), shared)
        check_risk(risk, risk_param)
        if num_critics < 1 or policy_delay < 1:
            raise ValueError("AC-IQN needs algo.num_critics >= 1 and algo.policy_delay >= 1.")
        if min(n_quantiles, n_target_quantiles, n_policy_quantiles) < 1 or kappa <= 0:
            raise ValueError("AC-IQN needs algo.n_*quantiles >= 1 and algo.kappa > 0.")
        if len(critic_hidden_sizes) < 2:
            raise ValueError(
                f"algo.critic_hidden_sizes={list(critic_hidden_sizes)}: AC-IQN's critic needs at least two "
                "widths (the state-action trunk, then the head)."
            )
        save_hparams(self, self.hp)
        obs_dim = int(torch.Size(self.obs_shape).numel())
        act_dim = self.actions.action_dim
        actor_hidden = [int(w) for w in actor_hidden_sizes]
        self.actor = nn.Sequential(
            trunk(obs_dim, actor_hidden),
            nn.Linear(actor_hidden[-1] if actor_hidden else obs_dim, act_dim),
            nn.Tanh(),
        )
        critics = [
            ImplicitQuantileNet(obs_dim + act_dim, [int(w) for w in critic_hidden_sizes], 1, n_cos)
            for _ in range(num_critics)
        ]
        self.critic = Ensemble(critics)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        # The last actor loss, reported by every update (the actor steps only every policy_delay updates).
        self.register_buffer("last_actor_loss", torch.zeros(()))
        self.policy_delay = policy_delay
        self.num_updates = 0  # host counter that schedules the actor steps; checkpointed

    # ------------------------------------------------------------------ networks
    def policy(self, observation: Tensor, target: bool = False) -> Tensor:
        """The deterministic action in ``[-1, 1]``, ``[B, A]``."""
        return (self.actor_target if target else self.actor)(observation.float())

    def quantiles(
        self, observation: Tensor, action: Tensor, tau: Tensor, target: bool = False, detach: bool = False
    ) -> Tensor:
        """Every critic's :math:`Z_\\tau(s, a)`, ``[E, B, N]``.

        Args:
            observation: ``[B, obs_dim]``.
            action: ``[B, A]`` in ``[-1, 1]``.
            tau: ``[B, N]`` fractions.
            target: the target critics.
            detach: no gradient into the critics' parameters (the actor's loss).
        """
        critic = self.critic_target if target else self.critic
        return critic(torch.cat([observation.float(), action], -1), tau, detach=detach).squeeze(-1).float()

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """A critic step on ``batch`` (``[B]`` transitions), then, unless the batch is marked
        :data:`CRITIC_ONLY`, an actor step and the Polyak update of the target actor and critics.

        Returns:
            ``loss_qvalue``, ``loss_actor`` (the latest actor step's), ``q_mean``, ``grad_norm`` (critics)
            and, for a prioritized sample, the per-sample critic losses as priorities.
        """
        # The losses read the batch without the mark: one compiled variant each for both kinds of update.
        sample = batch.exclude(CRITIC_ONLY)
        metrics, per_sample = self.critic_step(sample)
        # A key of the batch, set on the host by ``prepare_sample``: no tensor is read.
        if CRITIC_ONLY not in batch.keys():
            self.actor_step(sample)
        metrics.set("loss_actor", self.last_actor_loss.clone())
        return priority_feedback(metrics, batch, per_sample)

    def critic_step(self, batch: TensorDictBase) -> tuple[TensorDictBase, Tensor]:
        """One step of the critics on :meth:`critic_loss`.

        Returns:
            The metrics (``loss_qvalue``, ``q_mean``, ``grad_norm``) and the per-sample losses ``[B]``
            (averaged over critics).
        """
        loss, per_sample, q_mean = self.critic_loss(batch)
        opt = self.optimizer(1)
        self.clear_grads(opt)
        self.backward_loss(loss)
        grad_norm = self._clip(self._param_lists()["critic"], loss)
        opt.step()
        metrics = TensorDict(
            {"loss_qvalue": loss.detach(), "q_mean": q_mean.detach(), "grad_norm": grad_norm}, batch_size=[]
        )
        return metrics, per_sample.detach()

    def critic_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, Tensor]:
        """The critics' loss (see the class docstring), the per-sample losses ``[B]`` (averaged over
        critics) and the mean predicted quantile."""
        hp = self.hparams
        obs = batch.get("observation").float()
        next_obs = batch.get(("next", "observation")).float()
        action = self.actions.from_env(batch.get("action").float())
        reward, discount = td_discount(batch, hp.gamma)
        b = obs.shape[0]
        with torch.no_grad():
            next_a = self.policy(next_obs, target=True)
            noise = (hp.target_noise * torch.randn_like(next_a)).clamp(
                -hp.target_noise_clip, hp.target_noise_clip
            )
            next_a = (next_a + noise).clamp(-1.0, 1.0)
            tau_next = torch.rand(b, hp.n_target_quantiles, device=obs.device)
            next_z = self.quantiles(next_obs, next_a, tau_next, target=True).min(0).values  # [B, N']
            target = reward + discount * next_z
        tau = torch.rand(b, hp.n_quantiles, device=obs.device)
        pred = self.quantiles(obs, action, tau)  # [E, B, N]
        per_critic = quantile_huber_loss(pred, target.expand(pred.shape[0], -1, -1), tau, hp.kappa)  # [E, B]
        per_sample = per_critic.sum(0)
        loss = weighted_mean(per_sample, batch.get("priority_weight", None))
        return loss, per_sample / pred.shape[0], pred.mean()

    def actor_step(self, batch: TensorDictBase) -> Tensor:
        """One actor step on :meth:`actor_loss`, then the Polyak target updates."""
        hp = self.hparams
        loss = self.actor_loss(batch)
        opt = self.optimizer(0)
        self.clear_grads(opt)
        self.backward_loss(loss)
        self._clip(self._param_lists()["actor"], loss)
        opt.step()
        p = self._param_lists()
        polyak_update(p["actor_target"], p["actor"], hp.tau)
        polyak_update(p["critic_target"], p["critic"], hp.tau)
        self.last_actor_loss.copy_(loss.detach())
        return loss.detach()

    def actor_loss(self, batch: TensorDictBase) -> Tensor:
        """The actor's loss: minus the distorted mean of the first critic at the policy's actions."""
        hp = self.hparams
        obs = batch.get("observation").float()
        tau = distort(
            torch.rand(obs.shape[0], hp.n_policy_quantiles, device=obs.device), hp.risk, hp.risk_param
        )
        # Critic parameters detached: the actor's loss moves only the actor.
        z = self.quantiles(obs, self.policy(obs), tau, detach=True)[0]  # [B, K]
        return -z.mean()

    # ------------------------------------------------------------------ helpers
    def _clip(self, params: list[Tensor], loss: Tensor) -> Tensor:
        if self.hparams.grad_clip is None:
            return torch.zeros((), device=loss.device)
        return clip_grad_norm(params, self.hparams.grad_clip).detach()

    def _collect_params(self) -> dict[str, list[Tensor]]:
        """The parameters of the actor, the critic and their targets."""
        names = ("actor", "critic", "actor_target", "critic_target")
        return {name: list(getattr(self, name).parameters()) for name in names}

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        return [
            self.make_optimizer(self.actor.parameters(), self.hparams.actor_lr),
            self.make_optimizer(self.critic.parameters(), self.hparams.critic_lr),
        ]
