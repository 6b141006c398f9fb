"""PPO (Schulman et al. 2017): the clipped surrogate objective on rollouts, with GAE(λ) advantages.

The update reads like CleanRL's ``ppo.py`` (the "37 implementation details" of Huang et al. 2022): per
minibatch the probability ratio of the taken actions, the clipped surrogate, the value loss (clipped
around the rollout's values or not), an entropy bonus, advantages normalized per minibatch, one Adam step
with the gradients clipped to a global norm. What the data path does around it (``docs/ppo.md``):

- a rollout is ``T`` steps of ``N`` envs from the collector, each step with the policy's ``log_prob`` (and,
  for continuous actions, the unclipped sample ``raw_action`` it was drawn as);
- :meth:`PPO.prepare_rollout` adds the values, the GAE advantages and the returns once per rollout;
- ``epochs`` passes over ``minibatches`` shuffled minibatches of the rollout, each one :meth:`PPO.update`;
  with ``target_kl`` the passes stop after the epoch whose last minibatch's approximate KL exceeds it;
- then the rollout is dropped.

Where it differs from CleanRL, and why:

- **Truncation bootstraps.** CleanRL treats a time limit as a termination; here GAE cuts the λ-trace at
  every episode end but bootstraps from the value of the last observation where the episode was truncated
  (TorchRL's ``generalized_advantage_estimate`` with ``done`` and ``terminated`` apart).
- **Continuous actions in network units.** The Gaussian's sample is clipped to ``[-1, 1]`` and mapped to
  the env's bounds (CleanRL hands the raw sample to a ``ClipAction`` wrapper in the env's units), so one
  ``log_std_init`` suits any bounds; ``action_squash=tanh`` is the squashed alternative, with the tanh's
  log-determinant in the log-probability. The log-probability is always that of the unclipped sample.

A2C is this update with one epoch, one minibatch, no clipping (``clip_coef`` large, ``clip_value_loss``
off) and no advantage normalization: the ``a2c`` configuration (``conf/algo/a2c.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.data import Bounded, Categorical, TensorSpec
from torchrl.objectives.value.functional import generalized_advantage_estimate

from rl_lightning.algos.base import IncompatibleEnvError, ReplayRequirements, RLModule, RolloutRequirements
from rl_lightning.algos.common import ActionScaler, GreedyPolicy, LinearSchedule, clip_grad_norm, without_grad
from rl_lightning.compat import attached_trainer
from rl_lightning.nn.encoders import encoded, feature_dim, make_encoder

__all__ = ["PPO", "PPOPolicy", "gae", "ppo_losses"]


def gae(
    reward: Tensor,
    value: Tensor,
    next_value: Tensor,
    terminated: Tensor,
    done: Tensor,
    gamma: float,
    lmbda: float,
) -> tuple[Tensor, Tensor]:
    """GAE(λ) advantages and λ-returns of a rollout, ``[N, T]`` each (time last).

    ``delta_t = r_t + gamma * (1 - terminated_t) * V(s_{t+1}) - V(s_t)`` and ``A_t = delta_t + gamma *
    lmbda * (1 - done_t) * A_{t+1}``: the trace stops at every episode end (``done``: terminated or
    truncated), the bootstrap only at a termination, so a truncated episode is valued by its last
    observation's value. The rollout's last step bootstraps from ``next_value`` as well.

    Args:
        reward: ``[N, T]``.
        value: ``V(s_t)``, ``[N, T]``.
        next_value: ``V(s_{t+1})``, ``[N, T]``: the value of the observation each step reached (for an
            episode's last step, its final observation, before the reset).
        terminated: ``[N, T]`` bool.
        done: ``[N, T]`` bool, ``terminated | truncated``.
        gamma: discount.
        lmbda: the trace's decay λ.

    Returns:
        ``advantage`` and ``returns = advantage + value``, ``[N, T]``.
    """
    unsqueeze = [t.unsqueeze(-1) for t in (value, next_value, reward, done, terminated)]
    advantage, returns = generalized_advantage_estimate(gamma, lmbda, *unsqueeze, time_dim=-2)
    return advantage.squeeze(-1), returns.squeeze(-1)


def ppo_losses(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantage: Tensor,
    value: Tensor,
    old_value: Tensor,
    returns: Tensor,
    clip_coef: Tensor | float,
    clip_value_loss: bool,
) -> dict[str, Tensor]:
    """The clipped surrogate and value losses of a minibatch ``[B]``, with the ratio's diagnostics.

    ``ratio = exp(log_prob - old_log_prob)``; ``loss_policy = mean(max(-A ratio, -A clip(ratio, 1 - c,
    1 + c)))``; ``loss_value = 0.5 mean((V - R)^2)`` or, clipped, ``0.5 mean(max((V - R)^2, (V_old +
    clip(V - V_old, -c, c) - R)^2))``; ``approx_kl = mean((ratio - 1) - log ratio)`` (Schulman's unbiased
    estimator, as CleanRL logs it); ``clip_fraction``: the share of samples whose ratio left ``[1 - c,
    1 + c]``.
    """
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    surrogate = torch.maximum(-advantage * ratio, -advantage * ratio.clamp(1 - clip_coef, 1 + clip_coef))
    unclipped = (value - returns).square()
    if clip_value_loss:
        clipped = old_value + (value - old_value).clamp(-clip_coef, clip_coef)
        value_loss = 0.5 * torch.maximum(unclipped, (clipped - returns).square()).mean()
    else:
        value_loss = 0.5 * unclipped.mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > clip_coef).float().mean()
    return {
        "loss_policy": surrogate.mean(),
        "loss_value": value_loss,
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
    }


def _taken(log_p: Tensor, action: Tensor) -> Tensor:
    """The log-probabilities ``[B]`` of the taken actions ``[B]`` among ``log_p`` ``[B, A]``."""
    return log_p.gather(-1, action.long().reshape(-1, 1)).squeeze(-1)


def _layer(layer: nn.Linear, std: float) -> nn.Linear:
    """Orthogonal weights with gain ``std`` and zero biases (CleanRL's ``layer_init``)."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.zeros_(layer.bias)
    return layer


def _tanh_mlp(in_features: int, hidden_sizes: Sequence[int], out_features: int, out_std: float) -> nn.Module:
    """CleanRL's PPO MLP: tanh between orthogonally initialized layers, the last one scaled by ``out_std``."""
    layers: list[nn.Module] = []
    for width in hidden_sizes:
        layers += [_layer(nn.Linear(in_features, width), math.sqrt(2)), nn.Tanh()]
        in_features = width
    return nn.Sequential(*layers, _layer(nn.Linear(in_features, out_features), out_std))


class PPOPolicy(nn.Module):
    """The deterministic continuous policy as a plain module (for export): the Gaussian's mean, clipped or
    squashed into ``[-1, 1]``, in the env's bounds."""

    def __init__(self, mean: nn.Module, actions: ActionScaler, squash: str) -> None:
        super().__init__()
        self.mean = mean
        self.actions = actions
        self.squash = squash

    def forward(self, observation: Tensor) -> Tensor:
        loc = self.mean(observation.float())[..., : self.actions.action_dim]
        return self.actions.to_env(torch.tanh(loc) if self.squash == "tanh" else loc.clamp(-1, 1))


class PPO(RLModule):
    """Proximal Policy Optimization with a clipped surrogate, for discrete and continuous actions.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, *obs_shape]``).
        action_spec: ``Categorical`` (discrete) or ``Bounded`` (continuous) actions.
        hidden_sizes: widths of the actor's and of the critic's own hidden layers (tanh between), after
            the shared layers (``[]``: linear heads, as CleanRL's Atari PPO).
        encoder: what reads the observation first (:mod:`rl_lightning.nn.encoders`); ``auto``: a CNN for
            images, shared by actor and critic.
        shared_hidden_sizes: widths of ReLU layers after the encoder that actor and critic share (CleanRL's
            Atari PPO: ``[512]``, the Nature network's fully connected layer); ``[]``: none.
        lr: Adam learning rate (annealed linearly to 0 over ``anneal_frames`` with ``anneal_lr``).
        anneal_lr: anneal the learning rate.
        anneal_frames: the frames the annealing spans (the run's ``total_frames``).
        gamma: discount.
        gae_lambda: GAE's λ.
        rollout_steps: steps ``T`` per env in one rollout: each collection is ``T × env.num_envs`` frames
            (for on-policy algorithms ``collect.frames_per_batch`` follows it, and there is no warm-up).
        epochs: passes over each rollout.
        minibatches: minibatches per pass (each of ``N * T / minibatches`` samples).
        clip_coef: the surrogate's clipping range ``c`` (also the value clipping's).
        anneal_clip: anneal ``c`` linearly to 0 with the learning rate.
        clip_value_loss: clip the value loss around the rollout's values.
        value_coef: weight of the value loss.
        entropy_coef: weight of the entropy bonus.
        normalize_advantages: normalize advantages per minibatch (zero mean, unit std).
        grad_clip: max global gradient norm (``None``: none).
        target_kl: stop a rollout's passes after an epoch whose approximate KL exceeds it (``None``: never).
        log_std: ``state_independent`` (a learned vector, CleanRL's) or ``state_dependent`` (an actor
            output) standard deviation of continuous actions.
        log_std_init: the initial log standard deviation.
        action_squash: ``clip`` the Gaussian sample into ``[-1, 1]``, or ``tanh``-squash it.
        adam_eps: Adam's ε (1e-5, CleanRL's).
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("losses",)}

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        hidden_sizes: Sequence[int] = (64, 64),
        encoder: str = "auto",
        shared_hidden_sizes: Sequence[int] = (),
        lr: float = 2.5e-4,
        anneal_lr: bool = True,
        anneal_frames: int = 500_000,
        gamma: float = 0.99,
        gae_lambda: float = 0.95,
        rollout_steps: int = 128,
        epochs: int = 4,
        minibatches: int = 4,
        clip_coef: float = 0.2,
        anneal_clip: bool = False,
        clip_value_loss: bool = True,
        value_coef: float = 0.5,
        entropy_coef: float = 0.01,
        normalize_advantages: bool = True,
        grad_clip: float | None = 0.5,
        target_kl: float | None = None,
        log_std: str = "state_independent",
        log_std_init: float = 0.0,
        action_squash: str = "clip",
        adam_eps: float = 1e-5,
    ) -> None:
        super().__init__(observation_spec, action_spec)
        self.discrete = isinstance(action_spec, Categorical)
        if not self.discrete and not isinstance(action_spec, Bounded):
            raise IncompatibleEnvError(
                f"PPO needs discrete (Categorical) or bounded continuous actions, but the env's actions are "
                f"{type(action_spec).__name__}."
            )
        if not (0.0 < gamma <= 1.0 and 0.0 <= gae_lambda <= 1.0):
            raise ValueError(
                f"algo.gamma={gamma} must lie in (0, 1] and algo.gae_lambda={gae_lambda} in [0, 1]."
            )
        if min(rollout_steps, epochs, minibatches, anneal_frames) < 1:
            raise ValueError("algo.rollout_steps, epochs, minibatches and anneal_frames must be >= 1.")
        if clip_coef <= 0 or value_coef < 0 or entropy_coef < 0:
            raise ValueError("algo.clip_coef must be > 0, algo.value_coef and algo.entropy_coef >= 0.")
        if log_std not in ("state_independent", "state_dependent"):
            raise ValueError(f"algo.log_std={log_std!r}: choose state_independent or state_dependent.")
        if action_squash not in ("clip", "tanh"):
            raise ValueError(f"algo.action_squash={action_squash!r}: choose clip or tanh.")
        if target_kl is not None and target_kl <= 0:
            raise ValueError(f"algo.target_kl={target_kl} must be > 0 (or null: no early stop).")
        # Not logged: the run's resolved config is logged once, flattened.
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"], logger=False)
        obs = observation_spec["observation"]
        torso = make_encoder(encoder, obs)
        features = feature_dim(torso, obs)
        shared: list[nn.Module] = [] if torso is None else [torso]
        for width in shared_hidden_sizes:
            shared += [_layer(nn.Linear(features, int(width)), math.sqrt(2)), nn.ReLU()]
            features = int(width)
        torso = None if not shared else shared[0] if len(shared) == 1 else nn.Sequential(*shared)
        hidden = [int(w) for w in hidden_sizes]
        if self.discrete:
            self.n_actions = out = int(action_spec.space.n)
        else:
            self.actions = ActionScaler(action_spec, "PPO")
            out = self.actions.action_dim * (2 if log_std == "state_dependent" else 1)
        actor_head = _tanh_mlp(features, hidden, out, 0.01)
        # One encoder and its shared layers: the critic's loss trains them too (CleanRL's Atari agent).
        self.actor = encoded(torso, actor_head)
        self.critic = encoded(torso, _tanh_mlp(features, hidden, 1, 1.0))
        if not self.discrete and log_std == "state_independent":
            self.log_std = nn.Parameter(torch.full((self.actions.action_dim,), float(log_std_init)))
        elif not self.discrete:  # the actor's log-std outputs start at log_std_init
            last = actor_head[-1]
            nn.init.constant_(last.bias[self.actions.action_dim :], float(log_std_init))
        self.register_buffer("explained_variance", torch.zeros(()), persistent=False)
        #: The learning rate at the frames last set (:meth:`set_frames`).
        self.lr_now = float(lr)
        self.clip_schedule = LinearSchedule(clip_coef, 0.0 if anneal_clip else clip_coef, anneal_frames)

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Rollouts instead of a replay: each collection, ``epochs`` passes of ``minibatches``, whose rows
        keep what :meth:`losses` reads."""
        hp = self.hparams
        rollout = RolloutRequirements(hp.rollout_steps, hp.epochs, hp.minibatches, hp.target_kl)
        sample = "action" if self.discrete else "raw_action"
        keys = ("observation", sample, "log_prob", "state_value", "advantage", "value_target")
        return ReplayRequirements(discount=hp.gamma, rollout=rollout, sample_keys=keys)

    # ------------------------------------------------------------------ the policy
    def _distribution(self, observation: Tensor) -> tuple[Tensor, Tensor | None]:
        """Logits ``[B, A]`` (discrete), or the Gaussian's mean and standard deviation ``[B, A]`` each."""
        out = self.actor(observation.float())
        if self.discrete:
            return out, None
        a = self.actions.action_dim
        if self.hparams.log_std == "state_independent":
            return out, self.log_std.expand_as(out).exp()
        return out[..., :a], out[..., a:].exp()

    def _log_prob_entropy(
        self, first: Tensor, scale: Tensor | None, sample: Tensor, entropy_grad: bool = True
    ) -> tuple[Tensor, Tensor]:
        """Log-probability of ``sample`` (the action index, or the unclipped pre-squash Gaussian sample)
        under the distribution :meth:`_distribution` gave, and its entropy, ``[B]`` each (a squashed
        Gaussian's entropy is the Gaussian's, as CleanRL and SB3 report it). ``entropy_grad=False``: the
        entropy is computed outside autograd (a metric only, when its loss weight is 0)."""
        with_grad = entropy_grad and torch.is_grad_enabled()
        if scale is None:
            log_p = torch.log_softmax(first.float(), -1)
            with torch.set_grad_enabled(with_grad):
                entropy = -(log_p.exp() * log_p).sum(-1)
            return _taken(log_p, sample), entropy
        dist = torch.distributions.Normal(first, scale)
        log_prob = dist.log_prob(sample).sum(-1)
        if self.hparams.action_squash == "tanh":  # log |d tanh(u) / du| = 2 (log 2 - u - softplus(-2u))
            log_prob = log_prob - (2 * (math.log(2) - sample - nn.functional.softplus(-2 * sample))).sum(-1)
        with torch.set_grad_enabled(with_grad):
            entropy = dist.entropy().sum(-1)
        return log_prob, entropy

    def _to_env(self, sample: Tensor) -> Tensor:
        """The env's action for a Gaussian sample: clipped or squashed into ``[-1, 1]``, then scaled."""
        squashed = torch.tanh(sample) if self.hparams.action_squash == "tanh" else sample.clamp(-1, 1)
        return self.actions.to_env(squashed)

    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Sampled actions for the ``[N]`` envs with their ``log_prob`` (and the unclipped ``raw_action``)."""
        first, scale = self._distribution(td.get("observation"))
        if scale is None:  # Gumbel-max: a categorical sample without a host sync
            gumbel = -torch.log(-torch.log(torch.rand_like(first, dtype=torch.float32).clamp_min(1e-20)))
            log_p = torch.log_softmax(first.float(), -1)
            action = (log_p + gumbel).argmax(-1)
            log_prob = _taken(log_p, action)  # what _log_prob_entropy gives, without the entropy
        else:
            sample = first + scale * torch.randn_like(first)
            action = self._to_env(sample)
            td.set("raw_action", sample)
            log_prob = self._log_prob_entropy(first, scale, sample)[0]
        td.set("action", action)
        td.set("log_prob", log_prob)
        return td

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """The most probable action, or the Gaussian's mean clipped or squashed into the bounds."""
        first, _ = self._distribution(td.get("observation"))
        td.set("action", first.argmax(-1) if self.discrete else self._to_env(first))
        return td

    def export_policy(self) -> nn.Module:
        if self.discrete:
            return GreedyPolicy(self.actor)
        return PPOPolicy(self.actor, self.actions, self.hparams.action_squash)

    # ------------------------------------------------------------------ learning
    @torch.no_grad()
    def prepare_rollout(self, rollout: TensorDictBase) -> None:
        """Writes ``state_value``, ``advantage`` and ``value_target`` (the λ-return) into a rollout
        ``[N, T]``, and sets ``explained_variance``: ``1 - Var(R - V) / Var(R)`` of the values against the
        returns, which the rollout's updates report.

        Called once per rollout, before its minibatches, with the values of the network that collected it.
        """
        nxt = rollout.get("next")
        n, t = rollout.batch_size[:2]
        obs = rollout.get("observation").flatten(0, 1)
        next_obs = nxt.get("observation").flatten(0, 1)
        value = self.critic(obs.float()).reshape(n, t)
        next_value = self.critic(next_obs.float()).reshape(n, t)
        terminated = nxt.get("terminated").reshape(n, t)
        done = nxt.get("done").reshape(n, t)
        reward = nxt.get("reward").reshape(n, t).to(value.dtype)
        advantage, returns = gae(reward, value, next_value, terminated, done, self.hparams.gamma,
                                 self.hparams.gae_lambda)  # fmt: skip
        rollout.set("state_value", value)
        rollout.set("advantage", advantage)
        rollout.set("value_target", returns)
        self.explained_variance.copy_(1 - (returns - value).var() / returns.var().clamp_min(1e-8))

    def losses(self, batch: TensorDictBase) -> dict[str, Tensor]:
        """The minibatch's losses (``loss``, the weighted sum, among them) and diagnostics, ``[]`` each."""
        hp = self.hparams
        obs = batch.get("observation")
        sample = batch.get("action") if self.discrete else batch.get("raw_action")
        # Without an entropy bonus the entropy is a metric: its backward would only add zeros.
        log_prob, entropy = self._log_prob_entropy(*self._distribution(obs), sample, hp.entropy_coef != 0)
        value = self.critic(obs.float()).squeeze(-1)
        advantage = batch.get("advantage")
        if hp.normalize_advantages:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        out = ppo_losses(log_prob, batch.get("log_prob"), advantage, value, batch.get("state_value"),
                         batch.get("value_target"), self.clip_schedule.value, hp.clip_value_loss)  # fmt: skip
        out["entropy"] = entropy.mean()
        out["loss"] = (
            out["loss_policy"] - hp.entropy_coef * out["entropy"] + hp.value_coef * out["loss_value"]
        )
        return out

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One Adam step on a minibatch ``[B]`` of a prepared rollout.

        Returns:
            ``loss``, ``loss_policy``, ``loss_value``, ``entropy``, ``approx_kl``, ``clip_fraction``,
            ``grad_norm`` and the rollout's ``explained_variance``, scalars.
        """
        opt = self.optimizer()
        out = self.losses(batch)
        self.clear_grads(opt)
        self.backward_loss(out["loss"])
        if self.hparams.grad_clip is not None:
            grad_norm = clip_grad_norm(self._param_lists(), self.hparams.grad_clip)
        else:
            grad_norm = torch.zeros((), device=out["loss"].device)
        opt.step()
        metrics = {**out, "grad_norm": grad_norm, "explained_variance": self.explained_variance}
        return TensorDict({k: v.detach() for k, v in metrics.items()}, batch_size=[])

    def set_frames(self, frames: int) -> None:
        """Follows the frames (the clipping range's schedule), then sets the learning rate: annealed
        linearly to 0 over ``anneal_frames``, computed on the host from ``frames`` (no device read) once per
        collection; a tensor learning rate (capturable optimizers) is filled in place."""
        super().set_frames(frames)
        hp = self.hparams
        self.lr_now = hp.lr * (max(0.0, 1.0 - frames / hp.anneal_frames) if hp.anneal_lr else 1.0)
        for opt in self._built_optimizers():
            for group in opt.param_groups:
                if isinstance(group["lr"], Tensor):
                    group["lr"].fill_(self.lr_now)
                else:
                    group["lr"] = self.lr_now

    def _built_optimizers(self) -> list[Any]:
        """The optimizers built so far (none before a Trainer set them up, outside one none before the first
        :meth:`optimizer` call)."""
        if self.direct_optimizers is not None:
            return list(self.direct_optimizers)
        if attached_trainer(self) is not None:
            opts = self.optimizers()
            return opts if isinstance(opts, list) else [opts]
        return list(self._standalone_optimizers or [])

    def _collect_params(self) -> list[Tensor]:
        return [p for p in self.parameters() if p.requires_grad]

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self._collect_params(), self.lr_now, eps=self.hparams.adam_eps)
