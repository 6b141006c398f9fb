"""Latent MPPI planner of TD-MPC2, batched over environments.

TorchRL's ``MPPIPlanner`` rolls out an ``EnvBase`` and has no policy-prior samples, warm start or elite
sampling, so TD-MPC2 needs this planner. It plans in the world model's latent space:

1. 24 of 512 action sequences come from rolling out the policy prior; the rest are drawn from
   ``N(mean, std)``, with ``mean`` warm-started from the previous step's plan shifted by one step.
2. Each sequence is scored by ``sum_t γ^t r̂_t + γ^H Q_avg(z_H, π(z_H))`` (with termination masking when
   the model is episodic); the 64 best (elites) refit ``mean``/``std`` with weights
   ``softmax(temperature * value)``; repeated for 6 iterations.
3. The executed action is the first action of an elite drawn by Gumbel-max over the elite weights, plus
   ``N(0, std_0)`` exploration noise in training; ``eval_mode`` returns the plan's mean first action.

Every tensor has a static shape and no value leaves the device, so ``forward`` can be compiled and
captured in a CUDA graph whole. One MPPI iteration is a nested compile region (``MPPIPlanner._iterate``):
``torch.compile`` traces and generates it once and calls it for each iteration, rather than unrolling the
loop (``benchmarks/results/tdmpc2_compile.json`` holds the compile times).

Use one planner per set of environments (training and evaluation envs need separate instances because the
warm start is stored per environment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor, nn

from rl_lightning.algos.common import PerEnvState
from rl_lightning.algos.hparams import HParams
from rl_lightning.algos.tdmpc2 import math as tdm

__all__ = ["LatentModel", "MPPIPlanner", "PlannerSettings"]


class _PolicySample(Protocol):
    action: Tensor


class LatentModel(Protocol):
    """What the planner needs from a world model (``WorldModel`` satisfies it)."""

    episodic: bool

    def next(self, z: Tensor, a: Tensor) -> Tensor: ...

    def predict_reward(self, z: Tensor, a: Tensor) -> Tensor: ...

    def pi(self, z: Tensor) -> _PolicySample: ...

    def Q(self, z: Tensor, a: Tensor, return_type: Literal["min", "avg", "all"] = "min") -> Tensor: ...

    def termination(self, z: Tensor) -> Tensor: ...


@dataclass(frozen=True, kw_only=True)
class PlannerSettings(HParams):
    """How TD-MPC2's MPPI planner searches (the reference's defaults); the module's ``algo.*`` keys of
    the same names, passed down to every planner it builds.

    Attributes:
        horizon: planning horizon H (TD-MPC2 trains on slices of as many steps).
        iterations: MPPI iterations.
        num_samples: action sequences per iteration, policy-prior ones included.
        num_pi_trajs: sequences sampled from the policy prior (0 disables them).
        num_elites: elites used to refit the sampling distribution.
        temperature: inverse temperature of the elite weights ``exp(temperature * (v - max v))``.
        min_std: lower clamp of the sampling std.
        max_std: upper clamp and initial value of the sampling std.
        eval_sample_elite: in ``eval_mode`` return a Gumbel-sampled elite's first action (the reference's
            behaviour) instead of the plan's mean first action.
    """

    horizon: int = 3
    iterations: int = 6
    num_samples: int = 512
    num_pi_trajs: int = 24
    num_elites: int = 64
    temperature: float = 0.5
    min_std: float = 0.05
    max_std: float = 2.0
    eval_sample_elite: bool = False

    def __post_init__(self) -> None:
        n = self.num_samples
        if not 0 <= self.num_pi_trajs < n:
            raise ValueError(f"num_pi_trajs={self.num_pi_trajs} must lie in [0, num_samples={n}).")
        if not 0 < self.num_elites <= n:
            raise ValueError(f"num_elites={self.num_elites} must lie in (0, num_samples={n}].")
        if self.horizon < 1 or self.iterations < 1:
            raise ValueError(f"horizon={self.horizon} and iterations={self.iterations} must be at least 1.")
        if not 0 < self.min_std <= self.max_std:
            raise ValueError(f"Need 0 < min_std={self.min_std} <= max_std={self.max_std}.")


class MPPIPlanner(nn.Module):
    """TD-MPC2's latent MPPI planner for ``num_envs`` environments at once.

    Args:
        action_dim: action size; actions live in ``[-1, 1]``.
        num_envs: number of environments planned for in one call (fixes the warm-start buffer's shape).
        discount: γ used to sum predicted rewards and bootstrap with Q.
        settings: the search's settings (:class:`PlannerSettings`; its fields are read as the planner's
            attributes of the same names).

    Buffers:
        warm_start.value (``prev_mean``): ``[num_envs, horizon, action_dim]``, the last plan's mean, used as
            the warm start.
    """

    def __init__(
        self,
        action_dim: int,
        num_envs: int = 1,
        discount: float = 0.99,
        settings: PlannerSettings | None = None,
    ) -> None:
        super().__init__()
        s = self.settings = PlannerSettings() if settings is None else settings
        self.action_dim, self.num_envs, self.discount = action_dim, num_envs, discount
        self.horizon, self.iterations, self.num_samples = s.horizon, s.iterations, s.num_samples
        self.num_pi_trajs, self.num_elites, self.temperature = s.num_pi_trajs, s.num_elites, s.temperature
        self.min_std, self.max_std, self.eval_sample_elite = s.min_std, s.max_std, s.eval_sample_elite
        self.warm_start = PerEnvState(num_envs, (s.horizon, action_dim))

    @property
    def prev_mean(self) -> Tensor:
        """``[num_envs, H, A]``: the last plan's mean per env (the warm start)."""
        return self.warm_start.value

    def reset(self, env_mask: Tensor | None = None) -> None:
        """Clears the warm start of environments that begin a new episode.

        Args:
            env_mask: bool ``[num_envs]`` (or ``[num_envs, 1]``), True where an episode starts; ``None``
                clears all. Implemented with ``torch.where``, so it never synchronises.
        """
        self.warm_start.reset(env_mask)

    def initial_mean(self, t0: Tensor | None = None) -> Tensor:
        """Warm-start mean ``[num_envs, H, A]``: the previous mean shifted one step left, last step 0.

        Args:
            t0: optional bool ``[num_envs]``, True for an episode's first step (those envs start at 0).
        """
        shifted = torch.cat([self.prev_mean[:, 1:], torch.zeros_like(self.prev_mean[:, :1])], dim=1)
        if t0 is None:
            return shifted
        return torch.where(t0.reshape(self.num_envs, 1, 1).to(torch.bool), torch.zeros_like(shifted), shifted)

    def estimate_value(self, model: LatentModel, z: Tensor, actions: Tensor) -> Tensor:
        """Discounted return of action sequences in the model, bootstrapped with Q.

        Args:
            model: the latent model.
            z: start latents ``[M, latent]``.
            actions: ``[H, M, A]``.

        Returns:
            ``[M, 1]``: ``sum_t γ^t r̂_t + γ^H Q_avg(z_H, π(z_H))``; once the model predicts termination
            (probability > 0.5), later rewards and the bootstrap are dropped.
        """
        rewards, alive = [], []
        for t in range(self.horizon):
            rewards.append(model.predict_reward(z, actions[t]))
            z = model.next(z, actions[t])
            if model.episodic:  # a static model attribute, not a tensor value
                alive.append(self.alive_mask(model, z))
        return self.discounted_value(rewards, alive, self.bootstrap(model, z))

    def discounted_value(self, rewards: list[Tensor], alive: list[Tensor], q: Tensor) -> Tensor:
        """``sum_t γ^t m_t r_t + γ^H m_H q`` with ``m_t`` the product of the alive masks before step ``t``.

        Args:
            rewards: ``H`` decoded rewards ``[M, 1]``, of ``(z_t, a_t)``.
            alive: ``H`` masks ``[M, 1]`` (1 where the latent reached at step ``t`` does not terminate), or
                an empty list (a model without termination).
            q: ``[M, 1]`` the bootstrap at the horizon.
        """
        ret, mask, discount = torch.zeros_like(q), torch.ones_like(q), 1.0
        for t, reward in enumerate(rewards):
            ret = ret + discount * mask * reward
            discount = discount * self.discount
            if alive:
                mask = mask * alive[t]
        return ret + discount * mask * q

    @staticmethod
    def alive_mask(model: LatentModel, z: Tensor) -> Tensor:
        """``[M, 1]``: 1 where the model predicts no termination in latent ``z`` (probability <= 0.5)."""
        return (model.termination(z) <= 0.5).to(z.dtype)

    @staticmethod
    def bootstrap(model: LatentModel, z: Tensor) -> Tensor:
        """``[M, 1]``: ``Q_avg(z, π(z))``, the value of the rollout's last latent."""
        return model.Q(z, model.pi(z).action, return_type="avg")

    def _policy_actions(self, model: LatentModel, z: Tensor) -> Tensor:
        n, p = self.num_envs, self.num_pi_trajs
        z = z.unsqueeze(1).expand(n, p, z.shape[-1]).reshape(n * p, -1)
        actions = []
        for t in range(self.horizon):
            actions.append(model.pi(z).action)
            if t < self.horizon - 1:
                z = model.next(z, actions[-1])
        return torch.stack(actions).reshape(self.horizon, n, p, self.action_dim)

    def _iteration(
        self, model: LatentModel, z_rep: Tensor, mean: Tensor, std: Tensor, pi_actions: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """One MPPI iteration: sample around ``mean``/``std``, score, refit on the elites.

        Args:
            model: the latent model.
            z_rep: start latents repeated per sample ``[N * S, latent]``.
            mean: ``[H, N, A]`` sampling mean.
            std: ``[H, N, A]`` sampling std.
            pi_actions: ``[H, N, P, A]`` policy-prior sequences, or ``None``.

        Returns:
            ``(mean, std, elite_actions [H, N, K, A], score [N, K])``: the refitted distribution, the elites
            and their normalised weights.
        """
        actions = self.sample_actions(mean, std, pi_actions)
        value = self.estimate_value(model, z_rep, actions.reshape(self.horizon, -1, self.action_dim))
        return self.refit(actions, value)

    def sample_actions(self, mean: Tensor, std: Tensor, pi_actions: Tensor | None) -> Tensor:
        """An iteration's action sequences ``[H, N, S, A]``: the policy prior's (``pi_actions``
        ``[H, N, P, A]``, or ``None``) first, then ``S - P`` drawn from ``N(mean, std)`` (each ``[H, N, A]``)
        and clamped to ``[-1, 1]``."""
        h, n, a_dim = self.horizon, self.num_envs, self.action_dim
        noise = torch.randn(
            h, n, self.num_samples - self.num_pi_trajs, a_dim, device=mean.device, dtype=mean.dtype
        )
        sampled = (mean.unsqueeze(2) + std.unsqueeze(2) * noise).clamp(-1, 1)
        return sampled if pi_actions is None else torch.cat([pi_actions, sampled], dim=2)

    def refit(self, actions: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Refits the sampling distribution on the elites of an iteration's ``actions`` ``[H, N, S, A]``
        scored by ``value`` ``[N * S, 1]`` (NaN counts as 0); returns what :meth:`_iteration` does."""
        n, s, h, a_dim, k = self.num_envs, self.num_samples, self.horizon, self.action_dim, self.num_elites
        value = value.reshape(n, s).nan_to_num(0.0)
        elite_value, elite_idx = torch.topk(value, k, dim=1)  # [N, K]
        gather_idx = elite_idx.reshape(1, n, k, 1).expand(h, n, k, a_dim)
        elite_actions = torch.gather(actions, 2, gather_idx)  # [H, N, K, A]
        score = torch.exp(self.temperature * (elite_value - elite_value.max(1, keepdim=True).values))
        score = score / score.sum(1, keepdim=True)  # [N, K]
        w = score.reshape(1, n, k, 1)
        mean = (w * elite_actions).sum(2) / (w.sum(2) + 1e-9)
        std = ((w * (elite_actions - mean.unsqueeze(2)).pow(2)).sum(2) / (w.sum(2) + 1e-9)).sqrt()
        return mean, std.clamp(self.min_std, self.max_std), elite_actions, score

    #: :meth:`_iteration` as a nested compile region, which ``forward`` calls: ``torch.compile`` compiles the
    #: iteration once and runs that code ``iterations`` times instead of unrolling the loop into a graph
    #: ``iterations`` times as long (in eager mode the region is the method itself).
    _iterate = torch.compiler.nested_compile_region(_iteration)

    @torch.no_grad()
    def forward(
        self, model: LatentModel, z: Tensor, t0: Tensor | None = None, eval_mode: bool = False
    ) -> Tensor:
        """Plans one action per environment and stores the plan's mean as the next warm start.

        Args:
            model: the latent model (put it in eval mode: the reference plans without dropout).
            z: encoded observations ``[num_envs, latent]``.
            t0: optional bool ``[num_envs]``, True at an episode's first step (ignore the warm start).
            eval_mode: no exploration noise; return the mean plan's first action (or a sampled elite's,
                see ``eval_sample_elite``). A Python flag: compile one graph per value.

        Returns:
            Actions ``[num_envs, action_dim]`` in ``[-1, 1]``.
        """
        n, s = self.num_envs, self.num_samples
        if z.shape[0] != n:
            raise ValueError(f"z has {z.shape[0]} rows but the planner was built for num_envs={n}.")
        pi_actions = self._policy_actions(model, z) if self.num_pi_trajs > 0 else None
        z_rep = z.unsqueeze(1).expand(n, s, z.shape[-1]).reshape(n * s, -1)
        # [H, N, A] with the strides the iterations return (even where a dim is 1), so every call of the
        # compiled region matches the first
        mean = self.initial_mean(t0).transpose(0, 1).clone(memory_format=torch.contiguous_format)
        std = torch.full_like(mean, self.max_std)
        env_idx = torch.arange(n, device=z.device)
        for _ in range(self.iterations):
            mean, std, elite_actions, score = self._iterate(model, z_rep, mean, std, pi_actions)

        if eval_mode and not self.eval_sample_elite:
            action = mean[0]
        else:
            chosen = tdm.gumbel_softmax_sample(score, dim=1)  # [N]
            action = elite_actions[0, env_idx, chosen]
            if not eval_mode:
                action = action + std[0] * torch.randn_like(action)
        self.prev_mean.copy_(mean.transpose(0, 1))
        return action.clamp(-1, 1)
