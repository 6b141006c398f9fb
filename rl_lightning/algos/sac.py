"""Soft Actor-Critic (Haarnoja et al. 2018, with automatic entropy tuning) for continuous actions.

The losses are written on tensors here, with the math of TorchRL's ``SACLoss`` (its "v2" form without a
state-value network) and TD(0) estimator, without its TensorDict and functional-parameter machinery, which
on a CPU cost 40% more than the whole update of ``[256, 256]`` networks
(``benchmarks/results/sac_overhead.json``):

* twin critics ``Q_i(s, a)`` evaluated as one batched MLP
  (:class:`~rl_lightning.nn.actor_critic.EnsembleQNet`), with Polyak target copies;
* critic targets ``y = r + gamma ** steps * (1 - terminated) * min_i (Q'_i(s', a') - alpha log pi(a'|s'))``
  with ``a' ~ pi(.|s')`` (``steps``: ``steps_to_next_obs`` of n-step replay, else 1); MSE critic loss
  summed over the critics, as in the reference implementations;
* the actor loss ``alpha log pi(a|s) - min_i Q_i(s, a)`` with the reparameterised ``a ~ pi(.|s)`` and
  detached critics; the temperature loss ``-log(alpha) (log pi(a|s) + target_entropy)``, the target
  entropy ``-|A|`` by default;
* a tanh-squashed Gaussian actor scored on the pre-tanh sample (TorchRL's ``TanhNormal``,
  :func:`~rl_lightning.nn.actor_critic.tanh_normal_rsample`); prioritized samples weight every loss by
  ``priority_weight``, reduced as ``mean(w * L)`` (:func:`~rl_lightning.algos.common.weighted_mean`;
  ``SACLoss`` divides by the weights' sum), and their new priorities are the larger critic's ``|TD error|``.

The random draws come in ``SACLoss``'s order (the next actions, then the current ones), so from the same
weights and seed both give the same losses (``tests/algos/test_sac.py``).

One ``update``: the three losses from one forward pass (the actor loss sees detached critics, the critic
targets are computed without gradients, so one backward gives each optimizer its own gradients), three
Adam steps (actor, critics, temperature), then a Polyak update of the target critics. Several gradient
steps per collected frame are the data path's ``collect.updates_per_frame``.

:class:`SoftActorCritic` holds what SAC, discrete SAC (``rl_lightning.algos.sac_discrete``) and SAC with
options (``rl_lightning.algos.options``) share.
"""

from __future__ import annotations

import copy
import math
from abc import abstractmethod
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.data import Categorical, TensorSpec

from rl_lightning.algos.base import (
    TRANSITION_KEYS,
    IncompatibleEnvError,
    ReplayRequirements,
    RLModule,
    priority_feedback,
)
from rl_lightning.algos.common import (
    ActionScaler,
    ScaledActorPolicy,
    bootstrapped_targets,
    clip_grad_norm,
    polyak_update,
    weighted_mean,
    without_grad,
)
from rl_lightning.algos.hparams import (
    SoftActorCriticHParams,
    save_hparams,
    shares,
    split_shared,
    vector_obs_dim,
)
from rl_lightning.nn.actor_critic import EnsembleQNet, GaussianActorNet, TanhMean, tanh_normal_rsample

__all__ = ["SAC", "SoftActorCritic", "sac_outputs"]

#: The metrics every ``SoftActorCritic._losses`` reports: the three losses and two more figures.
SAC_OUTPUTS = ("loss_qvalue", "loss_actor", "loss_alpha", "alpha", "entropy")


class SoftActorCritic(RLModule):
    """What SAC, discrete SAC and SAC with options share: one Adam per network, one update of the summed
    losses, Polyak targets, PER feedback.

    Subclasses implement ``_losses`` (replay sample -> the losses and TD errors), ``_collect_params`` (the
    parameters of each optimizer), ``act`` and ``act_eval``; ``_update_targets`` (Polyak by default) and
    ``_learning_rates`` where they differ.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec.
        **shared: the family's settings, :class:`~rl_lightning.algos.hparams.SoftActorCriticHParams`
            (learning rates, ``gamma``, ``tau``, ``grad_clip``, ``hidden_sizes``, the critic ensemble and
            the temperature); recorded in ``hparams`` with the subclass's own arguments.
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("_losses",)}
    hp: SoftActorCriticHParams

    def __init__(self, observation_spec: TensorSpec, action_spec: TensorSpec, **shared: Any) -> None:
        super().__init__(observation_spec, action_spec)
        (self.hp,) = split_shared(type(self), shared)
        save_hparams(self, self.hp)
        self.obs_dim = vector_obs_dim(self, type(self).__name__)

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(
            discount=self.hparams.gamma, n_step=True, prioritized=True, sample_keys=TRANSITION_KEYS
        )

    @abstractmethod
    def _losses(self, batch: TensorDictBase) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """The losses of ``batch`` (``[B]`` transitions, left unchanged).

        Returns:
            Their sum (the critic targets carry no gradient and the actor loss reads detached critics, so
            the sum's gradient is each loss's own gradient on its own parameters), the detached metrics
            (every name of ``SAC_OUTPUTS``, and what a subclass adds), and the TD errors ``[B]`` (the new
            priorities).
        """

    @abstractmethod
    def _collect_params(self) -> dict[str, list[Tensor]]:
        """The parameters of each optimizer, in ``update``'s order (``actor``, ``qvalue``, ``alpha``, and
        what a subclass adds), then those of the target networks (names starting with ``target``);
        ``_param_lists`` keeps them."""

    def _update_targets(self) -> None:
        """One Polyak step of the target critics towards the critics (``target_critic`` and ``qvalue`` of
        ``_collect_params``)."""
        params = self._param_lists()
        polyak_update(params["target_critic"], params["qvalue"], self.hparams.tau)

    def _learning_rates(self) -> dict[str, float]:
        """Each optimizer's learning rate, by the name of its parameters in ``_collect_params``."""
        hp = self.hparams
        return {"actor": hp.actor_lr, "qvalue": hp.critic_lr, "alpha": hp.alpha_lr}

    def _optimizer_params(self) -> dict[str, list[Tensor]]:
        """The parameters of each optimizer, in the order ``update`` steps them."""
        return {name: p for name, p in self._param_lists().items() if not name.startswith("target")}

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One step on ``batch`` (``[B]`` transitions): one backward of the summed losses, one Adam step of
        each optimizer, then the targets' Polyak step.

        Returns:
            ``loss_qvalue`` (summed over the critics), ``loss_actor``, ``loss_alpha``, ``alpha`` (the
            temperature the losses used), ``entropy`` (the policy's, estimated on the batch) and what a
            subclass adds, with ``grad_norm_<name>`` of each network (``actor``, ``qvalue``, ...) when
            clipping, and, for a prioritized sample, the new priorities under ``"priority"``.
        """
        loss, metrics, td_error = self._losses(batch)
        groups = self._optimizer_params()
        optimizers = [self.optimizer(i) for i in range(len(groups))]
        self.clear_grads(*optimizers)
        self.backward_loss(loss)
        clip = self.hparams.grad_clip
        if clip is not None:
            for name, params in groups.items():
                if name != "alpha":
                    metrics[f"grad_norm_{name}"] = clip_grad_norm(params, clip)
        for opt in optimizers:
            opt.step()
        self._update_targets()
        return priority_feedback(TensorDict(metrics, batch_size=[]), batch, td_error)

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        """One Adam per network (actor, critics, temperature, ...), in the order ``update`` steps them."""
        lrs = self._learning_rates()
        return [self.make_optimizer(params, lrs[name]) for name, params in self._optimizer_params().items()]


def sac_outputs(losses: dict[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
    """SAC's three losses summed (what ``update`` differentiates) and ``SAC_OUTPUTS`` detached."""
    loss = losses["loss_qvalue"] + losses["loss_actor"] + losses["loss_alpha"]
    return loss, {k: losses[k].detach() for k in SAC_OUTPUTS}


@shares(SoftActorCriticHParams)
class SAC(SoftActorCritic):
    """Soft Actor-Critic for bounded continuous actions.

    Checkpoints of the versions built on TorchRL's ``SACLoss`` load: their entries are renamed
    (``legacy_state_keys``, ``legacy_state_prefixes``).

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be ``Bounded`` (continuous, finite bounds).
        target_entropy: the entropy ``alpha`` is tuned towards; ``None``: ``-|A|`` (the SAC paper's).
        **shared: :class:`~rl_lightning.algos.hparams.SoftActorCriticHParams`.
    """

    legacy_state_keys: ClassVar[dict[str, str]] = {"loss_module.log_alpha": "log_alpha"}
    #: The rest of a ``SACLoss``'s entries: the actor's shared weights, alpha's initial value, gamma.
    legacy_state_prefixes: ClassVar[dict[str, str | None]] = {
        "loss_module.qvalue_network_params.module.": "critic.",
        "loss_module.target_qvalue_network_params.module.": "target_critic.",
        "loss_module.": None,
    }

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        target_entropy: float | None = None,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, **shared)
        if isinstance(action_spec, Categorical):
            raise IncompatibleEnvError(
                "SAC here is for continuous actions, but the env's actions are discrete; "
                "use algo=sac_discrete (e.g. +experiment=sac_discrete_cartpole)."
            )
        # Affine map between the actor's [-1, 1] and the env's bounds (rejects unbounded actions).
        self.actions = ActionScaler(action_spec, "SAC")
        hp, action_dim = self.hp, self.actions.action_dim
        self.actor_net = GaussianActorNet(self.obs_dim, action_dim, hp.hidden_sizes)
        self.critic = EnsembleQNet(self.obs_dim, action_dim, hp.hidden_sizes, hp.num_qvalue_nets)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(hp.alpha_init)), requires_grad=hp.autotune_alpha)
        self.target_entropy = -float(action_dim) if target_entropy is None else float(target_entropy)

    # ------------------------------------------------------------------ losses
    def _losses(self, batch: TensorDictBase) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """SAC's three losses on ``batch``; see the module docstring for the formulas."""
        obs = batch.get("observation").float()
        action = self.actions.from_env(batch.get("action"))
        weights = batch.get("priority_weight", None)
        weights = None if weights is None else weights.reshape(-1).float()
        alpha = self.log_alpha.detach().exp()
        y = self.critic_targets(batch, alpha)
        q = self.critic(obs, action).squeeze(-1)  # [E, B]
        loss_q = weighted_mean(((q - y) ** 2).sum(0), weights)
        td_error = (q - y).detach().abs().max(0)[0]
        new_action, log_prob = tanh_normal_rsample(*self.actor_net(obs))
        q_pi = self.critic(obs, new_action, detach=True).squeeze(-1).min(0)[0]
        loss_pi = weighted_mean(alpha * log_prob - q_pi, weights)
        loss_alpha = weighted_mean(-self.log_alpha * (log_prob.detach() + self.target_entropy), weights)
        losses = {
            "loss_qvalue": loss_q,
            "loss_actor": loss_pi,
            "loss_alpha": loss_alpha,
            "alpha": alpha,
            "entropy": -log_prob.detach().mean(),
        }
        return *sac_outputs(losses), td_error

    @torch.no_grad()
    def critic_targets(self, batch: TensorDictBase, alpha: Tensor) -> Tensor:
        """The critics' targets ``[B]``: ``r + gamma ** steps * (1 - terminated) * v(s')``, with
        ``v(s') = min_i (Q'_i(s', a') - alpha log pi(a'|s'))`` and ``a' ~ pi(.|s')`` one fresh sample (the
        update's first random draw).
        """
        nxt = batch.get("next")
        next_obs = nxt.get("observation").float()
        next_action, next_log_prob = tanh_normal_rsample(*self.actor_net(next_obs))
        q_next = self.target_critic(next_obs, next_action).squeeze(-1)  # [E, B]
        steps = batch.get("steps_to_next_obs", None)
        return bootstrapped_targets(
            nxt.get("reward").reshape(-1).float(),
            nxt.get("terminated").reshape(-1),
            (q_next - alpha * next_log_prob).min(0)[0],
            self.hparams.gamma,
            None if steps is None else steps.reshape(-1),
        )

    def _collect_params(self) -> dict[str, list[Tensor]]:
        """The optimizers' parameters, and the target critics' for the Polyak step."""
        return {
            "actor": list(self.actor_net.parameters()),
            "qvalue": list(self.critic.parameters()),
            "alpha": [self.log_alpha],
            "target_critic": list(self.target_critic.parameters()),
        }

    # ------------------------------------------------------------------ hot paths
    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Actions ``[N, A]`` sampled from the squashed Gaussian for observations ``[N, obs_dim]``."""
        loc, scale = self.actor_net(td.get("observation").float())
        action = torch.tanh(torch.addcmul(loc, scale, torch.randn_like(loc)))
        td.set("action", self.actions.to_env(action))
        return td

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """The deterministic action ``tanh(mean)``, in the env's bounds."""
        loc, _ = self.actor_net(td.get("observation").float())
        td.set("action", self.actions.to_env(torch.tanh(loc)))
        return td

    def export_policy(self) -> nn.Module:
        """``tanh(mean)`` of the actor, in the env's bounds (what ``act_eval`` does)."""
        return ScaledActorPolicy(TanhMean(self.actor_net), self.actions)
