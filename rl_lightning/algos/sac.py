"""Soft Actor-Critic (Haarnoja et al. 2018, with automatic entropy tuning) for continuous actions.

The losses are TorchRL's ``SACLoss`` (the "v2" form without a state-value network: twin Q-networks
vmapped as one ensemble, clipped double-Q soft targets from target Q-networks, MSE critic loss as in the
reference implementations, ``loss_function="l2"``; TorchRL's default is smooth-L1), its TD(0) value
estimator (with n-step replay it discounts the bootstrap by ``gamma ** steps_to_next_obs``) and a
tanh-squashed Gaussian actor (TorchRL's ``TanhNormal``, scored on the pre-tanh sample). The entropy
temperature ``alpha`` is learned towards a target entropy of ``-|A|``.

One ``update``: the three losses from one forward pass (the actor loss sees detached Q-parameters, the
critic targets are computed without gradients, so one backward gives each optimizer its own gradients),
three Adam steps (actor, critics, temperature), then a Polyak update of the target critics. Several
gradient steps per collected frame are the data path's ``collect.updates_per_frame``.

:class:`SoftActorCritic` holds what SAC and discrete SAC (``rl_lightning.algos.sac_discrete``) share.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.data import Bounded, Categorical, TensorSpec
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import LossModule, SACLoss, SoftUpdate, ValueEstimators

from rl_lightning.algos.base import IncompatibleEnvError, ReplayRequirements, RLModule, priority_feedback
from rl_lightning.algos.common import ActionScaler, ScaledActorPolicy
from rl_lightning.nn.actor_critic import GaussianActorNet, QNet, TanhMean

__all__ = ["SAC", "SoftActorCritic"]


class SoftActorCritic(RLModule):
    """What SAC and discrete SAC share: three optimizers, one update, Polyak targets, PER feedback.

    Subclasses build ``self.loss_module`` (a TorchRL SAC loss with ``actor_network_params``,
    ``qvalue_network_params``, ``target_qvalue_network_params`` and ``log_alpha``), call
    ``_finish_loss`` (value estimator, TorchRL's ``SoftUpdate`` of the target critics) and implement
    ``_loss_input`` (replay sample -> the loss's input), ``act`` and ``act_eval``.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec.
        gamma: discount.
        tau: Polyak rate of the target critics.
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critics.
        alpha_lr: Adam learning rate of ``log(alpha)``.
        grad_clip: max gradient norm of the actor and of the critics (``None``: no clipping).
    """

    cuda_graph_safe = ("update", "act")
    loss_module: LossModule

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        gamma: float,
        tau: float,
        actor_lr: float,
        critic_lr: float,
        alpha_lr: float,
        grad_clip: float | None,
    ) -> None:
        super().__init__(observation_spec, action_spec)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"algo.gamma={gamma} must lie in (0, 1].")
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"algo.tau={tau} must lie in (0, 1] (1 copies the critics every update).")
        if grad_clip is not None and grad_clip <= 0:
            raise ValueError(f"algo.grad_clip={grad_clip} must be > 0 or null (no clipping).")
        if len(self.obs_shape) != 1:
            raise IncompatibleEnvError(
                f"{type(self).__name__} takes vector observations, got shape {tuple(self.obs_shape)}; "
                "flatten the observation with a gymnasium wrapper."
            )
        self.obs_dim = int(self.obs_shape[0])
        self._params_cache: dict[str, list[torch.Tensor]] | None = None

    def _finish_loss(self, gamma: float, tau: float) -> None:
        self.loss_module.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
        self.target_updater = SoftUpdate(self.loss_module, tau=tau)
        # SACLoss creates its target-entropy buffer on first use: create it now, so that the state dict
        # has the same keys before and after the first update (checkpoints load either way).
        _ = self.loss_module.target_entropy

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(discount=self.hparams.gamma, n_step=True, prioritized=True)

    @abstractmethod
    def _loss_input(self, batch: TensorDictBase) -> TensorDictBase:
        """The replay sample as the loss reads it (a shallow copy: the sample itself is left unchanged)."""

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One SAC step on ``batch`` (``[B]`` transitions).

        Returns:
            ``loss_qvalue`` (summed over the two critics), ``loss_actor``, ``loss_alpha``, ``alpha`` (the
            temperature the losses used), ``entropy`` (the policy's, estimated on the batch), with
            ``grad_norm_actor``/``grad_norm_qvalue`` when clipping, and, for a prioritized sample, the new
            priorities (the larger of the two critics' ``|TD error|``) under ``"priority"``.
        """
        td = self._loss_input(batch)
        losses = self.loss_module(td)
        loss_q, loss_pi, loss_alpha = (losses.get(k) for k in ("loss_qvalue", "loss_actor", "loss_alpha"))
        optimizers = [self.optimizer(i) for i in range(3)]
        for opt in optimizers:
            opt.zero_grad(set_to_none=False)
        # The critic targets carry no gradient and the actor loss reads detached critics: the sum's
        # gradient is each loss's own gradient on its own parameters.
        self.backward_loss(loss_q + loss_pi + loss_alpha)
        metrics = {
            "loss_qvalue": loss_q.detach(),
            "loss_actor": loss_pi.detach(),
            "loss_alpha": loss_alpha.detach(),
            "alpha": losses.get("alpha").detach(),
            "entropy": losses.get("entropy").detach(),
        }
        if self.hparams.grad_clip is not None:
            params = self._param_lists()
            metrics["grad_norm_actor"] = nn.utils.clip_grad_norm_(params["actor"], self.hparams.grad_clip)
            metrics["grad_norm_qvalue"] = nn.utils.clip_grad_norm_(params["critic"], self.hparams.grad_clip)
        for opt in optimizers:
            opt.step()
        self.target_updater.step()
        return priority_feedback(TensorDict(metrics, batch_size=[]), batch, td.get("td_error"))

    # ------------------------------------------------------------------ parameters and optimizers
    def _param_lists(self) -> dict[str, list[torch.Tensor]]:
        # Walking the TensorDictParams costs more than a small net's update on a CPU: cache the leaves,
        # and drop the cache whenever the module moves (see ``_apply``).
        if self._params_cache is None:
            loss = self.loss_module
            self._params_cache = {
                "actor": list(loss.actor_network_params.values(True, True)),
                "critic": list(loss.qvalue_network_params.values(True, True)),
            }
        return self._params_cache

    def _apply(self, fn, recurse: bool = True):
        self._params_cache = None
        return super()._apply(fn, recurse)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """Actor, critics, temperature: one Adam each (the order ``update`` steps them in)."""
        hp = self.hparams
        params = self._param_lists()
        return [
            self.make_optimizer(params["actor"], hp.actor_lr),
            self.make_optimizer(params["critic"], hp.critic_lr),
            self.make_optimizer([self.loss_module.log_alpha], hp.alpha_lr),
        ]


class SAC(SoftActorCritic):
    """Soft Actor-Critic for bounded continuous actions.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be ``Bounded`` (continuous, finite bounds).
        hidden_sizes: hidden widths of the actor and of each critic.
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critics.
        alpha_lr: Adam learning rate of ``log(alpha)``.
        gamma: discount.
        tau: Polyak rate of the target critics.
        alpha_init: initial entropy temperature.
        autotune_alpha: learn ``alpha`` towards ``target_entropy``; ``False`` keeps ``alpha_init``.
        target_entropy: the entropy ``alpha`` is tuned towards; ``None``: ``-|A|`` (the SAC paper's).
        num_qvalue_nets: critics in the ensemble; the target is the minimum over them.
        grad_clip: max gradient norm of the actor and of the critics (``None``: no clipping).
    """

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        hidden_sizes: Sequence[int] = (256, 256),
        actor_lr: float = 3e-4,
        critic_lr: float = 3e-4,
        alpha_lr: float = 3e-4,
        gamma: float = 0.99,
        tau: float = 0.005,
        alpha_init: float = 1.0,
        autotune_alpha: bool = True,
        target_entropy: float | None = None,
        num_qvalue_nets: int = 2,
        grad_clip: float | None = None,
    ) -> None:
        super().__init__(observation_spec, action_spec, gamma, tau, actor_lr, critic_lr, alpha_lr, grad_clip)
        if isinstance(action_spec, Categorical):
            raise IncompatibleEnvError(
                "SAC here is for continuous actions, but the env's actions are discrete; "
                "use algo=sac_discrete (e.g. +experiment=sac_discrete_cartpole)."
            )
        # Affine map between the actor's [-1, 1] and the env's bounds (rejects unbounded actions).
        self.actions = ActionScaler(action_spec, "SAC")
        if alpha_init <= 0:
            raise ValueError(f"algo.alpha_init={alpha_init} must be > 0.")
        if num_qvalue_nets < 1:
            raise ValueError(f"algo.num_qvalue_nets={num_qvalue_nets} must be >= 1.")
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        action_dim = self.actions.action_dim
        self.actor_net = GaussianActorNet(self.obs_dim, action_dim, hidden_sizes)
        unit_box = Bounded(-1.0, 1.0, shape=(action_dim,))
        actor = ProbabilisticActor(
            TensorDictModule(self.actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
            in_keys=["loc", "scale"],
            out_keys=["action"],
            spec=unit_box,
            distribution_class=TanhNormal,
        )
        critic = ValueOperator(
            QNet(self.obs_dim, action_dim, hidden_sizes), in_keys=["observation", "action"]
        )
        self.loss_module = SACLoss(
            actor,
            critic,
            num_qvalue_nets=num_qvalue_nets,
            loss_function="l2",
            alpha_init=alpha_init,
            fixed_alpha=not autotune_alpha,
            target_entropy="auto" if target_entropy is None else target_entropy,
            action_spec=unit_box,
        )
        self._finish_loss(gamma, tau)

    def _loss_input(self, batch: TensorDictBase) -> TensorDictBase:
        td = batch.copy()
        td.set("action", self.actions.from_env(batch.get("action")))
        return td

    # ------------------------------------------------------------------ hot paths
    @torch.no_grad()
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Actions ``[N, A]`` sampled from the squashed Gaussian for observations ``[N, obs_dim]``."""
        loc, scale = self.actor_net(td.get("observation").float())
        action = torch.tanh(loc + scale * torch.randn_like(loc))
        td.set("action", self.actions.to_env(action))
        return td

    @torch.no_grad()
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """The deterministic action ``tanh(mean)``, in the env's bounds."""
        loc, _ = self.actor_net(td.get("observation").float())
        td.set("action", self.actions.to_env(torch.tanh(loc)))
        return td

    def export_policy(self) -> nn.Module:
        """``tanh(mean)`` of the actor, in the env's bounds (what ``act_eval`` does)."""
        return ScaledActorPolicy(TanhMean(self.actor_net), self.actions)
