"""TD3 (Fujimoto et al. 2018) and DDPG (Lillicrap et al. 2016): deterministic actors, Gaussian exploration.

TD3's losses are TorchRL's ``TD3Loss``: clipped double-Q targets from target critics, target policy
smoothing (clipped Gaussian noise on the target actor's action), the actor trained on the first critic.
DDPG's are TorchRL's ``DDPGLoss`` (one critic, target actor and critic). Both use MSE critic losses and
TD(0) targets (``gamma ** steps_to_next_obs`` with n-step replay); targets follow TorchRL's ``SoftUpdate``.
Actors act in ``[-1, 1]`` (a tanh output layer); noise scales are in those units, and actions are mapped
affinely to the env's bounds (stored actions are mapped back in ``update``).

The delayed actor update: ``update(batch)`` is one full step (critic, actor, targets); a batch that
carries the key ``"critic_only"`` gets the critic step alone. ``prepare_sample`` marks ``policy_delay - 1``
of every ``policy_delay`` batches on the host from a Python update counter, so no tensor is read and no
Python branch depends on a tensor value: a CUDA-graphed ``update`` has one graph per input signature
(critic-only and full), both of static shapes, and the compiled losses (``compile_regions``) read the batch
without the mark, one variant each.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, TensorSpec
from torchrl.modules import Actor, ValueOperator
from torchrl.objectives import DDPGLoss, LossModule, SoftUpdate, TD3Loss, ValueEstimators

from rl_lightning.algos.base import RLModule, priority_feedback
from rl_lightning.algos.common import (
    CRITIC_ONLY,
    ActionScaler,
    clip_grad_norm,
)
from rl_lightning.algos.deterministic import DeterministicActorMixin
from rl_lightning.algos.hparams import (
    DeterministicActorCriticHParams,
    save_hparams,
    shares,
    split_shared,
    vector_obs_dim,
)
from rl_lightning.nn.actor_critic import DeterministicActorNet, QNet

__all__ = ["CRITIC_ONLY", "DDPG", "TD3", "DeterministicActorCritic"]

#: Checkpoint entry of the host-side update counter that schedules the delayed actor.
_COUNTER_KEY = "actor_critic_updates"


class DeterministicActorCritic(DeterministicActorMixin, RLModule):
    """What TD3 and DDPG share: the deterministic actor, exploration and the delayed actor's schedule
    (:class:`~rl_lightning.algos.deterministic.DeterministicActorMixin`), the delayed update, PER feedback.

    Subclasses build ``self.loss_module`` and implement ``_critic_loss`` and ``_actor_loss``.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be ``Bounded`` (continuous, finite bounds).
        policy_delay: critic updates per actor (and target) update.
        **shared: :class:`~rl_lightning.algos.hparams.DeterministicActorCriticHParams` (learning rates,
            ``gamma``, ``tau``, ``grad_clip``, ``hidden_sizes``, ``exploration_noise``); recorded in
            ``hparams`` with the subclass's own arguments.
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("_critic_loss", "_actor_loss")}
    ddp_find_unused_parameters = True  # the critic's backward skips the actor; the actor's, the critics
    loss_module: LossModule
    hp: DeterministicActorCriticHParams
    update_counter_key = _COUNTER_KEY
    actor_attribute = "actor_net"

    def __init__(
        self, observation_spec: TensorSpec, action_spec: TensorSpec, policy_delay: int, **shared: Any
    ) -> None:
        super().__init__(observation_spec, action_spec)
        name = type(self).__name__
        self.actions = ActionScaler(action_spec, name)
        self.obs_dim, self.action_dim = vector_obs_dim(self, name), self.actions.action_dim
        (self.hp,) = split_shared(type(self), shared)
        if policy_delay < 1:
            raise ValueError(f"algo.policy_delay={policy_delay} must be >= 1 (1: no delay).")
        save_hparams(self, self.hp)
        self.unit_box = Bounded(-1.0, 1.0, shape=(self.action_dim,))
        self.actor_net = DeterministicActorNet(self.obs_dim, self.action_dim, self.hp.hidden_sizes)
        self.policy_delay = policy_delay
        # The last actor step's loss (and gradient norm), returned by critic-only updates too, so that every
        # update has the same metrics.
        self.register_buffer("last_loss_actor", torch.zeros(()))
        self.register_buffer("last_grad_norm_actor", torch.zeros(()))
        # Updates scheduled so far: a Python int, read on the host only (checkpointed by the mixin).
        self.num_updates = 0

    def _modules_for_loss(self) -> tuple[Actor, ValueOperator]:
        """The actor (around ``actor_net``) and a critic as TorchRL modules, for the loss to take over.

        Not registered here: the loss owns their parameters (TD3Loss re-initialises one critic per
        ensemble member), so registering them would list unused template parameters.
        """
        actor = Actor(self.actor_net, in_keys=["observation"], out_keys=["action"], spec=self.unit_box)
        critic = ValueOperator(
            QNet(self.obs_dim, self.action_dim, self.hp.hidden_sizes), in_keys=["observation", "action"]
        )
        return actor, critic

    def _finish_loss(self) -> None:
        self.loss_module.make_value_estimator(ValueEstimators.TD0, gamma=self.hparams.gamma)
        self.target_updater = SoftUpdate(self.loss_module, tau=self.hparams.tau)

    # ------------------------------------------------------------------ the update
    def _loss_input(self, batch: TensorDictBase) -> TensorDictBase:
        """A shallow copy of the replay sample with its actions mapped to ``[-1, 1]``, without the
        :data:`CRITIC_ONLY` mark: both kinds of update hand the compiled losses the same keys."""
        td = batch.exclude(CRITIC_ONLY)
        td.set("action", self.actions.from_env(batch.get("action")))
        return td

    def _critic_loss(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Returns the critic loss, ``|TD error|`` ``[B]`` and the mean predicted Q-value."""
        raise NotImplementedError

    def _actor_loss(self, td: TensorDictBase) -> torch.Tensor:
        raise NotImplementedError

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One critic step on ``batch`` (``[B]`` transitions), then, unless the batch is marked
        :data:`CRITIC_ONLY`, one actor step and a Polyak update of every target network.

        Returns:
            ``loss_qvalue``, ``loss_actor`` (the latest actor step's), ``q_mean`` (mean predicted Q),
            ``grad_norm_qvalue``/``grad_norm_actor`` when clipping, and, for a prioritized sample, the new
            priorities ``|TD error|`` under ``"priority"``.
        """
        td = self._loss_input(batch)
        opt_actor, opt_critic = self.optimizer(0), self.optimizer(1)
        params = self._param_lists()
        loss_q, td_error, q_value = self._critic_loss(td)
        self.clear_grads(opt_critic)
        self.backward_loss(loss_q)
        clip = self.hparams.grad_clip
        metrics = {"loss_qvalue": loss_q.detach(), "q_mean": q_value.detach()}
        if clip is not None:
            metrics["grad_norm_qvalue"] = clip_grad_norm(params["critic"], clip).detach()
        opt_critic.step()
        # A key of the batch, set on the host by ``prepare_sample``: no tensor is read.
        if CRITIC_ONLY not in batch.keys():
            loss_pi = self._actor_loss(td)
            self.clear_grads(opt_actor)
            self.backward_loss(loss_pi)
            if clip is not None:
                self.last_grad_norm_actor.copy_(clip_grad_norm(params["actor"], clip))
            opt_actor.step()
            self.target_updater.step()
            self.last_loss_actor.copy_(loss_pi.detach())
        metrics["loss_actor"] = self.last_loss_actor.clone()
        if clip is not None:
            metrics["grad_norm_actor"] = self.last_grad_norm_actor.clone()
        return priority_feedback(TensorDict(metrics, batch_size=[]), batch, td_error)

    def _collect_params(self) -> dict[str, list[torch.Tensor]]:
        """The leaves of the loss's actor and critic TensorDictParams."""
        loss = self.loss_module
        critic = loss.qvalue_network_params if isinstance(loss, TD3Loss) else loss.value_network_params
        return {
            "actor": list(loss.actor_network_params.values(True, True)),
            "critic": list(critic.values(True, True)),
        }

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """Actor, then critic(s): one Adam each."""
        params = self._param_lists()
        return [
            self.make_optimizer(params["actor"], self.hparams.actor_lr),
            self.make_optimizer(params["critic"], self.hparams.critic_lr),
        ]


@shares(DeterministicActorCriticHParams)
class TD3(DeterministicActorCritic):
    """Twin Delayed DDPG: clipped double Q, target policy smoothing, delayed actor and target updates.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be ``Bounded`` (continuous, finite bounds).
        policy_delay: critic updates per actor (and target) update.
        target_noise: std of the smoothing noise on the target actor's action, in ``[-1, 1]`` units.
        noise_clip: the smoothing noise is clipped to ``[-noise_clip, noise_clip]``.
        num_qvalue_nets: critics in the ensemble; the target is the minimum over them.
        **shared: :class:`~rl_lightning.algos.hparams.DeterministicActorCriticHParams`.
    """

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        policy_delay: int = 2,
        target_noise: float = 0.2,
        noise_clip: float = 0.5,
        num_qvalue_nets: int = 2,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, policy_delay, **shared)
        if target_noise < 0 or noise_clip < 0:
            raise ValueError("algo.target_noise and algo.noise_clip must be >= 0.")
        if num_qvalue_nets < 1:
            raise ValueError(f"algo.num_qvalue_nets={num_qvalue_nets} must be >= 1.")
        actor, critic = self._modules_for_loss()
        self.loss_module = TD3Loss(
            actor,
            critic,
            action_spec=self.unit_box,
            num_qvalue_nets=num_qvalue_nets,
            policy_noise=target_noise,
            noise_clip=noise_clip,
            loss_function="l2",
        )
        self._finish_loss()

    def _critic_loss(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss, meta = self.loss_module.value_loss(td)
        # TD3Loss reports squared TD errors per critic; PER's priority is the larger |TD error|.
        return loss, meta["td_error"].detach().amax(0).sqrt(), meta["pred_value"].mean()

    def _actor_loss(self, td: TensorDictBase) -> torch.Tensor:
        return self.loss_module.actor_loss(td)[0]


@shares(DeterministicActorCriticHParams)
class DDPG(DeterministicActorCritic):
    """Deep Deterministic Policy Gradient: one critic, target actor and critic, Gaussian exploration.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be ``Bounded`` (continuous, finite bounds).
        **shared: :class:`~rl_lightning.algos.hparams.DeterministicActorCriticHParams`.
    """

    def __init__(self, observation_spec: TensorSpec, action_spec: TensorSpec, **shared: Any) -> None:
        super().__init__(observation_spec, action_spec, 1, **shared)
        actor, critic = self._modules_for_loss()
        self.loss_module = DDPGLoss(actor, critic, loss_function="l2", delay_actor=True)
        self._finish_loss()

    def _critic_loss(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss, meta = self.loss_module.loss_value(td)
        return loss, meta["td_error"].sqrt(), meta["pred_value"].mean()

    def _actor_loss(self, td: TensorDictBase) -> torch.Tensor:
        return self.loss_module.loss_actor(td)[0]
