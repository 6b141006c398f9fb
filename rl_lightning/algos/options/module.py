"""SAC with options: a soft option-critic on SAC's machinery, off-policy, for continuous or discrete actions.

The math (values, continuation, targets, the termination gradient, selection) and its derivation are in
:mod:`rl_lightning.algos.options.math`. The pieces:

* intra-option policies ``π(a|s,ω)`` for ``K`` options: tanh-Gaussian (continuous) or categorical
  (discrete) heads on one shared trunk (:mod:`rl_lightning.nn.options`), all ``K`` in one call;
* twin critics ``Q_i(s,ω,a)`` (one output per option, vmapped as one :class:`Ensemble`) with Polyak target
  copies, and the option value ``Q_Ω(s,ω) = E_a[min_i Q_i(s,ω,a) - α log π(a|s,ω)]``;
* a policy over options, ``softmax(Q_Ω/τ_Ω)`` or ε-greedy, and terminations ``β(s,ω)`` learned with the
  option-critic termination gradient plus a deliberation cost ``ξ`` on the next state;
* the entropy temperature ``α`` tuned as in SAC.

TorchRL's ``SACLoss`` does not fit: its critic has no option axis, its target has no continuation
``U(s',ω)``, and it has no terminations. The losses are written here with ``SACLoss``'s formulas (MSE
critic loss summed over the critics, the same tanh-Gaussian sample and score), so that ``K = 1`` with
``terminations="never"`` gives SAC's update within float rounding (``tests/algos/test_options_module.py``).

**Acting.** Per env, the active option and its age live in :class:`PerEnvState` buffers (``age = 0``: no
option yet). ``act`` resets the age where an episode starts, samples the terminations of the active
options and the new options for all envs in one batched call (:func:`select_options`), acts with the
chosen option, and writes ``option`` and ``option_age`` (1 on an option's first step) into the data, so
the replay stores the option that acted. Option usage over the last ``usage_window`` steps is kept on the
device for the metrics.

**Warm-up.** During the random warm-up (``collect.warmup_frames``) TorchRL's collector does not call
``act``: those rows carry no option. When the option keys first appear, the replay storage creates them
filled with zeros, so warm-up rows read ``option_age == 0``. Nothing needs their option: the critics and
the intra-option policies learn every option from every transition (the transition does not depend on
the option; see the math module), and the termination loss, which is about the option that acted,
skips rows with ``option_age == 0``.

**Evaluation** is deterministic and keeps its own per-env state for any number of envs: an option
terminates when ``β > 1/2``, the new one is ``argmax_ω min_i Q_i(s,ω,tanh(μ_ω))``, the action its mean.

Metrics (``update``): SAC's ``loss_qvalue``, ``loss_actor``, ``loss_alpha``, ``alpha``, ``entropy``, with
``loss_termination``, and under ``options/``: ``usage_<k>``, ``usage_min``, ``duration_mean`` (acting
window), ``termination_prob`` (``β(s',ω)`` of the replayed option), ``termination_prob_<k>`` (option
``k``'s ``β`` on the batch's next states), ``entropy_high`` (of ``π_Ω``) and
``entropy_low`` (of the intra-option policies).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import Categorical, TensorSpec

from rl_lightning.algos.base import TRANSITION_KEYS, ReplayRequirements
from rl_lightning.algos.common import ActionScaler, PerEnvState, episode_start, weighted_mean, without_grad
from rl_lightning.algos.hparams import SoftActorCriticHParams, shares
from rl_lightning.algos.options import math as om
from rl_lightning.algos.options.checks import check_arguments
from rl_lightning.algos.options.stats import OptionUsage
from rl_lightning.algos.sac import SoftActorCritic, sac_outputs
from rl_lightning.nn.layers import Ensemble
from rl_lightning.nn.options import (
    OptionCategoricalActorNet,
    OptionDiscreteQNet,
    OptionGaussianActorNet,
    OptionQNet,
    TerminationNet,
)

__all__ = ["OPTION_AGE_KEY", "OPTION_KEY", "SACOptions"]

#: Keys ``act`` writes and the replay stores: the option that acted and its age (1 on its first step).
OPTION_KEY, OPTION_AGE_KEY = "option", "option_age"


@shares(SoftActorCriticHParams)
class SACOptions(SoftActorCritic):
    """Soft option-critic: SAC with ``K`` options, learned terminations and a policy over options.

    SAC's update (:class:`~rl_lightning.algos.sac.SoftActorCritic`) with a fourth optimizer for the
    terminations and the option-usage metrics; the losses are this class's.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec: ``Bounded`` (tanh-Gaussian options) or ``Categorical``.
        num_options: ``K``.
        termination_lr: Adam learning rate of the terminations.
        target_entropy: the intra-option entropy ``alpha`` is tuned towards; ``None``: ``-|A|``
            (continuous) or ``0.89 log(n_actions)`` (discrete).
        option_policy: ``softmax`` (Boltzmann over ``Q_Ω``) or ``epsilon_greedy``.
        option_temperature: ``τ_Ω`` of the softmax policy over options.
        option_epsilon: ``ε`` of the ε-greedy policy over options.
        terminations: ``learned`` (termination gradient) or ``never`` (``β ≡ 0``: an option lasts an episode).
        termination_init: the termination probability the terminations start near.
        deliberation_cost: ``ξ``, charged per termination in the termination gradient.
        num_envs: training envs acting in one call (the per-env option state's size).
        usage_window: acting steps (all envs together) the usage and duration metrics cover.
        **shared: :class:`~rl_lightning.algos.hparams.SoftActorCriticHParams` (``hidden_sizes``: of the
            policy trunk, each critic and the termination net; the actor's learning rate is the
            intra-option policies'; ``grad_clip``: of each network).
    """

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        num_options: int = 4,
        termination_lr: float = 3e-4,
        target_entropy: float | None = None,
        option_policy: str = "softmax",
        option_temperature: float = 1.0,
        option_epsilon: float = 0.05,
        terminations: str = "learned",
        termination_init: float = 0.1,
        deliberation_cost: float = 0.01,
        num_envs: int = 1,
        usage_window: int = 10000,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, **shared)
        check_arguments(locals())
        hp = self.hp
        self.discrete = isinstance(action_spec, Categorical)
        self.num_options = k = num_options
        hidden = tuple(hp.hidden_sizes)
        if self.discrete:
            self.n_actions = int(action_spec.space.n)
            self.actor_net = OptionCategoricalActorNet(self.obs_dim, self.n_actions, k, hidden)
            critics = [
                OptionDiscreteQNet(self.obs_dim, self.n_actions, k, hidden) for _ in range(hp.num_qvalue_nets)
            ]
            default_entropy = 0.89 * math.log(self.n_actions)
        else:
            self.actions = ActionScaler(action_spec, "SAC with options")
            a = self.actions.action_dim
            self.actor_net = OptionGaussianActorNet(self.obs_dim, a, k, hidden)
            critics = [OptionQNet(self.obs_dim, a, k, hidden) for _ in range(hp.num_qvalue_nets)]
            default_entropy = -float(a)
        self.critic = Ensemble(critics)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.learn_terminations = terminations == "learned"
        self.termination_net = (
            TerminationNet(self.obs_dim, k, hidden, termination_init) if self.learn_terminations else None
        )
        self.log_alpha = nn.Parameter(torch.tensor(math.log(hp.alpha_init)), requires_grad=hp.autotune_alpha)
        self.target_entropy = default_entropy if target_entropy is None else float(target_entropy)
        self.active = PerEnvState(num_envs, dtype=torch.int64)
        self.age = PerEnvState(num_envs, dtype=torch.int64)
        self.usage = OptionUsage(k, usage_window)
        # Evaluation's per-env state, by number of envs; outside the module tree (and checkpoints): every
        # evaluation starts its episodes at step 0, where the state is reset anyway.
        self._eval_state: dict[int, tuple[Tensor, Tensor]] = {}

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions with the acting option; prioritized replay allowed.

        No n-step returns: the option may change inside ``n`` steps, and ``U(s_{t+n}, ω_t)`` would then
        bootstrap with the wrong option.
        """
        return ReplayRequirements(
            discount=self.hparams.gamma,
            prioritized=True,
            extra_keys=(OPTION_KEY, OPTION_AGE_KEY),
            sample_keys=TRANSITION_KEYS,
        )

    def export_policy(self) -> nn.Module:
        """Not available: the deterministic policy keeps an active option per env.

        Raises:
            NotImplementedError: always (it says why).
        """
        raise NotImplementedError(
            "SAC with options acts with per-env state: the active option continues until its termination "
            "(beta > 1/2 in evaluation), so the action is no function of the observation alone; load the "
            "checkpoint with the framework (evaluate) to act."
        )

    # ------------------------------------------------------------------ values
    def _alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()

    def _expand(self, obs: Tensor) -> Tensor:
        """``[B, obs_dim]`` -> ``[B, K, obs_dim]`` (one copy per option, a view)."""
        return obs.unsqueeze(-2).expand(*obs.shape[:-1], self.num_options, obs.shape[-1])

    def _soft_values(
        self, obs: Tensor, critic: Ensemble, detach: bool, alpha: Tensor, policy: Tensor | tuple | None = None
    ) -> tuple[Tensor, Tensor]:
        """Sampled (continuous) or exact (discrete) ``min_i Q_i - α log π`` for every option.

        ``policy`` is ``actor_net(obs)`` when the caller has it already.

        Returns:
            ``Q_Ω(s, ·) [B, K]`` and ``log π`` of the sample (``E_π[log π]`` when discrete) ``[B, K]``.
        """
        if self.discrete:
            q = critic(obs, detach=detach).min(0)[0]  # [B, K, n]
            logits = self.actor_net(obs) if policy is None else policy
            q_omega, log_pi, _ = om.categorical_option_values(logits, q, alpha)
            return q_omega, log_pi
        loc, scale = self.actor_net(obs) if policy is None else policy  # [B, K, A]
        action, log_pi = om.tanh_normal_rsample(loc, scale, common_noise=True)
        # Every option's sample through the critic's head of every option: keep the diagonal.
        q = critic(self._expand(obs), action, detach=detach).diagonal(dim1=-2, dim2=-1).min(0)[0]
        return q - alpha * log_pi, log_pi

    def _termination_probs(self, obs: Tensor) -> Tensor:
        """``β(s, ·) [B, K]`` (zeros with ``terminations="never"``)."""
        if self.termination_net is None:
            return obs.new_zeros(*obs.shape[:-1], self.num_options)
        return torch.sigmoid(self.termination_net(obs))

    def _option_probs(self, q_omega: Tensor) -> Tensor:
        hp = self.hparams
        return om.option_policy_probs(q_omega, hp.option_policy, hp.option_temperature, hp.option_epsilon)

    # ------------------------------------------------------------------ hot paths
    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Terminations, option choice and actions for the ``[N]`` training envs in one batched call.

        Writes ``action``, ``option [N]`` (the option that acts) and ``option_age [N]`` (1 on its first
        step) into ``td``.
        """
        n = td.batch_size[0] if td.batch_dims else 1
        if n != self.active.num_envs:
            raise ValueError(
                f"act got {n} envs but the option state was built for algo.num_envs={self.active.num_envs}; "
                "set algo.num_envs to env.num_envs (the default interpolation does)."
            )
        obs = td.get("observation").float().reshape(n, -1)
        start = episode_start(td)
        if start is not None:
            self.age.reset(start)
        prev = self.active.value
        beta_prev = self._termination_probs(obs).gather(-1, prev.unsqueeze(-1)).squeeze(-1)
        policy = self.actor_net(obs)
        q_omega, _ = self._soft_values(obs, self.critic, detach=False, alpha=self._alpha(), policy=policy)
        hp = self.hparams
        option, age, started = om.select_options(
            prev,
            self.age.value,
            beta_prev,
            q_omega,
            hp.option_policy,
            hp.option_temperature,
            hp.option_epsilon,
        )
        if self.discrete:
            logits = policy.gather(1, option.view(n, 1, 1).expand(n, 1, self.n_actions))
            gumbel = -torch.log(-torch.log(torch.rand_like(logits).clamp_min(1e-20)))
            td.set("action", (logits + gumbel).argmax(-1).reshape(n))
        else:
            loc, scale = policy
            idx = option.view(n, 1, 1).expand(n, 1, loc.shape[-1])
            loc, scale = loc.gather(1, idx).squeeze(1), scale.gather(1, idx).squeeze(1)
            td.set("action", self.actions.to_env(torch.tanh(loc + scale * torch.randn_like(loc))))
        self.active.set(option)
        self.age.set(age)
        self.usage.record(option, started)
        td.set(OPTION_KEY, option)
        td.set(OPTION_AGE_KEY, age)
        return td

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """Greedy options (kept until ``β > 1/2``) and mean actions for any number of envs ``[N]``."""
        n = td.batch_size[0] if td.batch_dims else 1
        obs = td.get("observation").float().reshape(n, -1)
        state = self._eval_state.get(n)
        if state is None or state[0].device != obs.device:
            state = self._eval_state[n] = (
                obs.new_zeros(n, dtype=torch.int64),
                obs.new_zeros(n, dtype=torch.int64),
            )
        prev, age = state
        start = episode_start(td)
        if start is not None:
            age = torch.where(start, torch.zeros_like(age), age)
        beta_prev = self._termination_probs(obs).gather(-1, prev.unsqueeze(-1)).squeeze(-1)
        if self.discrete:
            logits = self.actor_net(obs)
            q = self.critic(obs).min(0)[0]  # [N, K, n]
            greedy = logits.argmax(-1)  # [N, K]
            q_omega = q.gather(-1, greedy.unsqueeze(-1)).squeeze(-1)
        else:
            loc, _ = self.actor_net(obs)
            mean = torch.tanh(loc)  # [N, K, A]
            q_omega = self.critic(self._expand(obs), mean).diagonal(dim1=-2, dim2=-1).min(0)[0]
        option, age, _ = om.select_options(
            prev, age, beta_prev, q_omega, "softmax", 1.0, 0.0, deterministic=True
        )
        self._eval_state[n] = (option, age)
        if self.discrete:
            td.set("action", greedy.gather(-1, option.unsqueeze(-1)).squeeze(-1))
        else:
            idx = option.view(n, 1, 1).expand(n, 1, mean.shape[-1])
            td.set("action", self.actions.to_env(mean.gather(1, idx).squeeze(1)))
        td.set(OPTION_KEY, option)
        td.set(OPTION_AGE_KEY, age)
        return td

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One soft option-critic step on ``batch`` (``[B]`` transitions): SAC's, with the terminations'
        optimizer; see the module docstring.

        Returns:
            Detached scalars (the module docstring lists them) and, for a prioritized sample, the new
            priorities (mean over options of the larger critic's ``|TD error|``) under ``"priority"``.
        """
        out = super().update(batch)
        with torch.no_grad():
            out.update(self.usage.summary())
        return out

    def _losses(self, batch: TensorDictBase) -> tuple[Tensor, dict[str, Tensor], Tensor]:
        """The summed loss of ``batch`` (critics, intra-option policies, temperature, terminations; see
        the module docstring), the batch's detached metrics, and the priorities ``[B]``."""
        hp = self.hparams
        obs = batch.get("observation").float()
        next_obs = batch.get(("next", "observation")).float()
        reward = batch.get(("next", "reward")).float().reshape(-1, 1)
        terminated = batch.get(("next", "terminated")).bool().reshape(-1, 1)
        weights = batch.get("priority_weight", None)
        weights = None if weights is None else weights.reshape(-1)
        option = batch.get(OPTION_KEY, None)
        age = batch.get(OPTION_AGE_KEY, None)
        # Rows without an acting option (random warm-up) read age 0; see the module docstring.
        has_option = torch.zeros_like(terminated).reshape(-1) if age is None else age.reshape(-1) > 0
        option = (
            torch.zeros_like(has_option, dtype=torch.int64) if option is None else option.reshape(-1).long()
        )
        alpha = self._alpha()

        # Targets for every option's head: y(ω) = r + γ (1 - d) U(s', ω).
        beta_next = self._termination_probs(next_obs)  # [B, K], with grad for the termination loss
        with torch.no_grad():
            q_next, _ = self._soft_values(next_obs, self.target_critic, detach=False, alpha=alpha)
            probs_next = self._option_probs(q_next)
            v_next = om.option_state_value(q_next, probs_next)
            u = om.continuation_value(q_next, v_next, beta_next.detach())
            y = om.critic_targets(reward, terminated, hp.gamma, u)  # [B, K]

        # Critics: every option's head on the stored action.
        if self.discrete:
            q_all = self.critic(obs)  # [E, B, K, n]
            idx = batch.get("action").long().reshape(1, -1, 1, 1).expand(*q_all.shape[:-1], 1)
            q_pred = q_all.gather(-1, idx).squeeze(-1)
        else:
            q_pred = self.critic(obs, self.actions.from_env(batch.get("action")))  # [E, B, K]
        loss_q = weighted_mean(((q_pred - y) ** 2).sum(0).mean(-1), weights)
        td_error = (q_pred - y).abs().detach().max(0)[0].mean(-1)

        # Intra-option policies and temperature, every option on every state.
        q_pi, log_pi = self._soft_values(obs, self.critic, detach=True, alpha=alpha)
        loss_pi = weighted_mean((-q_pi).mean(-1), weights)
        entropy_gap = log_pi.detach() + self.target_entropy
        loss_alpha = weighted_mean((-self.log_alpha * entropy_gap).mean(-1), weights)

        # Terminations: the option that acted, at the next state, on non-terminal rows.
        beta_taken = beta_next.gather(-1, option.unsqueeze(-1)).squeeze(-1)
        advantage = q_next.gather(-1, option.unsqueeze(-1)).squeeze(-1) - v_next
        counted = has_option & ~terminated.reshape(-1)
        loss, metrics = sac_outputs(
            {
                "loss_qvalue": loss_q,
                "loss_actor": loss_pi,
                "loss_alpha": loss_alpha,
                "alpha": alpha,
                "entropy": -log_pi.detach().mean(),
            }
        )
        if self.learn_terminations:
            loss_beta = om.termination_loss(beta_taken, advantage, hp.deliberation_cost, counted, weights)
            loss = loss + loss_beta
            metrics["loss_termination"] = loss_beta.detach()
        with torch.no_grad():
            w = counted.float()
            metrics["options/termination_prob"] = (beta_taken.detach() * w).sum() / w.sum().clamp_min(1.0)
            # Each option's termination probability on the batch's next states: which options the
            # terminations keep running and which they stop at once.
            for k, beta_k in enumerate(beta_next.detach().mean(0).unbind()):
                metrics[f"options/termination_prob_{k}"] = beta_k
            metrics["options/entropy_high"] = -(probs_next * probs_next.clamp_min(1e-30).log()).sum(-1).mean()
            metrics["options/entropy_low"] = metrics["entropy"]
        return loss, metrics, td_error

    # ------------------------------------------------------------------ optimizers
    def _collect_params(self) -> dict[str, list[Tensor]]:
        """The optimizers' parameters (``termination`` only when learned), then the target critics'."""
        params = {
            "actor": list(self.actor_net.parameters()),
            "qvalue": list(self.critic.parameters()),
            "alpha": [self.log_alpha],
        }
        if self.termination_net is not None:
            params["termination"] = list(self.termination_net.parameters())
        params["target_critic"] = list(self.target_critic.parameters())
        return params

    def _learning_rates(self) -> dict[str, float]:
        return {**super()._learning_rates(), "termination": self.hparams.termination_lr}
