"""What the discrete members of the distributional family share: acting, the update, targets, noise.

C51, QR-DQN and IQN differ in what their network outputs and in the loss; everything else lives here:

- epsilon-greedy acting on the (distorted) expected Q-values, batched over envs, without host syncs;
  ``act_eval`` greedy with the noisy layers off, and ``export_policy`` the same greedy policy as a plain
  module (each member supplies its deterministic Q-values as one, :meth:`DiscreteDistributional.eval_q`);
- one update: fresh noise for the online and the target network (independent samples, as in
  Fortunato et al. 2018), the per-sample loss weighted by the prioritized-replay importance weights, one
  Adam step with gradient clipping, the target update, and the per-sample loss as the new priority
  (Rainbow's choice for distributional losses);
- target networks updated by Polyak averaging, or copied every ``k`` updates as a 0/1 ``lerp_`` weight
  computed on the device (no Python branch on a tensor, so a CUDA graph holds it);
- n-step transitions: the bootstrap is discounted by ``gamma ** steps_to_next_obs``.
"""

from __future__ import annotations

import copy
from abc import abstractmethod
from collections.abc import Callable, Sequence
from typing import ClassVar

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
    GreedyPolicy,
    LinearSchedule,
    clip_grad_norm,
    polyak_update,
    without_grad,
)
from rl_lightning.nn.encoders import encoded, feature_dim, make_encoder
from rl_lightning.nn.noisy import reset_noise

__all__ = ["DiscreteDistributional", "td_discount"]


def td_discount(batch: TensorDictBase, gamma: float) -> tuple[Tensor, Tensor]:
    """The reward ``[B, 1]`` and the bootstrap factor ``gamma ** steps_to_next_obs * (1 - terminated)``.

    ``steps_to_next_obs`` (written by the n-step transform) is 1 when absent.
    """
    reward = batch.get(("next", "reward")).float().reshape(-1, 1)
    alive = 1.0 - batch.get(("next", "terminated")).float().reshape(-1, 1)
    steps = batch.get("steps_to_next_obs", None)
    if steps is None:
        return reward, gamma * alive
    return reward, torch.pow(gamma, steps.float().reshape(-1, 1)) * alive


class DiscreteDistributional(RLModule):
    """Base of C51, QR-DQN and IQN (see the module docstring).

    Subclasses build ``self.online`` (the network, with :meth:`network`; ``self.target`` is copied from it
    here) and implement :meth:`q_values` and :meth:`per_sample_loss`.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, *obs_shape]``).
        action_spec: env action spec; must be discrete (``Categorical``).
        name: the algorithm's name, for messages.
        lr: Adam learning rate.
        gamma: discount.
        target_update: ``soft`` (Polyak, ``tau`` per update) or ``hard`` (copy every ``hard_update_every``).
        tau: Polyak rate of soft updates.
        hard_update_every: updates between copies of hard updates.
        eps_start: initial exploration rate.
        eps_end: final exploration rate.
        eps_decay_frames: frames over which epsilon decays linearly.
        grad_clip: max gradient norm (``None``: no clipping).
        adam_eps: Adam's epsilon (the distributional papers use ``0.01 / batch_size``).
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("per_sample_loss",)}
    online: nn.Module

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        name: str,
        lr: float,
        gamma: float,
        target_update: str,
        tau: float,
        hard_update_every: int,
        eps_start: float,
        eps_end: float,
        eps_decay_frames: int,
        grad_clip: float | None,
        adam_eps: float,
    ) -> None:
        super().__init__(observation_spec, action_spec)
        if not isinstance(action_spec, Categorical):
            raise IncompatibleEnvError(
                f"{name} needs a discrete action space, but the env's actions are "
                f"{type(action_spec).__name__} of shape {tuple(action_spec.shape[1:])}; use a discrete env "
                "(e.g. CartPole-v1 or HockeyVsOpponentDiscrete-v0) or AC-IQN for continuous actions."
            )
        if target_update not in ("soft", "hard"):
            raise ValueError(f"algo.target_update must be 'soft' or 'hard', got {target_update!r}.")
        if not 0.0 <= eps_end <= eps_start <= 1.0:
            raise ValueError(f"need 0 <= algo.eps_end ({eps_end}) <= algo.eps_start ({eps_start}) <= 1.")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"algo.gamma={gamma} must lie in (0, 1].")
        if hard_update_every < 1 or not 0.0 < tau <= 1.0:
            raise ValueError("algo.hard_update_every must be >= 1 and algo.tau in (0, 1].")
        self.n_actions = int(action_spec.space.n)
        self.obs_dim = int(torch.Size(self.obs_shape).numel())
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self.epsilon_schedule = LinearSchedule(eps_start, eps_end, eps_decay_frames)
        self._cfg = {
            "lr": lr, "gamma": gamma, "target_update": target_update, "tau": tau,
            "hard_update_every": hard_update_every, "grad_clip": grad_clip, "adam_eps": adam_eps,
        }  # fmt: skip

    def network(self, encoder: str, head: Callable[[int], nn.Module]) -> nn.Module:
        """The network of ``head(features)`` after the observation encoder ``encoder``
        (:mod:`rl_lightning.nn.encoders`; none for float vectors, whose head reads the observation)."""
        torso = make_encoder(encoder, self.observation_spec["observation"])
        return encoded(torso, head(feature_dim(torso, self.observation_spec["observation"])))

    def _make_target(self) -> None:
        """Copies ``self.online`` into ``self.target`` (called by subclasses once ``online`` exists)."""
        self.target = copy.deepcopy(self.online)
        self.target.requires_grad_(False)

    # ------------------------------------------------------------------ what subclasses provide
    @abstractmethod
    def q_values(self, observation: Tensor, noisy: bool = True, explore: bool = True) -> Tensor:
        """The (distorted) expected return of each action, ``[B, A]``, for observations ``[B, *obs_shape]``.

        ``explore``: the exploring policy's estimate (IQN samples its fractions) rather than the
        deterministic one (IQN's fixed grid).
        """

    @abstractmethod
    def eval_q(self) -> nn.Module:
        """The Q-values ``act_eval`` maximises as a plain module, ``[N, *obs_shape] -> [N, A]`` (for export).

        Noisy layers off, no randomness; it shares the online network's parameters.
        """

    @abstractmethod
    def per_sample_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor]:
        """The distributional loss of each transition ``[B]`` and the mean Q of the taken actions (scalar)."""

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(
            discount=self._cfg["gamma"], n_step=True, prioritized=True, sample_keys=TRANSITION_KEYS
        )

    def epsilon(self) -> Tensor:
        """The linear epsilon schedule at the frames last set (``set_frames``), on the module's device."""
        return self.epsilon_schedule.value

    @property
    def noisy(self) -> bool:
        return bool(self.hparams.get("noisy", False))

    # ------------------------------------------------------------------ hot paths
    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Epsilon-greedy actions ``[N]`` on the noisy (if any) network, without host syncs."""
        greedy = self.q_values(td.get("observation").float(), noisy=True, explore=True).argmax(-1)
        random = torch.randint_like(greedy, self.n_actions)
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon()
        td.set("action", torch.where(explore, random, greedy))
        return td

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """Greedy actions of the deterministic estimate, noisy layers off."""
        obs = td.get("observation").float()
        td.set("action", self.q_values(obs, noisy=False, explore=False).argmax(-1))
        return td

    def export_policy(self) -> nn.Module:
        """The greedy policy of ``act_eval``: the argmax of :meth:`eval_q`."""
        return GreedyPolicy(self.eval_q())

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One step on ``batch`` (``[B]`` transitions).

        Returns:
            ``loss``, ``grad_norm``, ``epsilon``, ``q_mean`` (scalars) and, for a prioritized sample, the
            per-sample losses as new priorities under ``"priority"``.
        """
        if self.noisy:
            reset_noise(self.online)
            reset_noise(self.target)
        per_sample, q_mean = self.per_sample_loss(batch)
        weight = batch.get("priority_weight", None)
        loss = (per_sample * weight.reshape(-1)).mean() if weight is not None else per_sample.mean()
        opt = self.optimizer()
        self.clear_grads(opt)
        self.backward_loss(loss)
        online, _ = self._param_lists()
        if self._cfg["grad_clip"] is not None:
            grad_norm = clip_grad_norm(online, self._cfg["grad_clip"])
        else:
            grad_norm = torch.zeros((), device=loss.device)
        opt.step()
        self.num_updates.add_(1)
        self._update_target()
        metrics = TensorDict(
            {
                "loss": loss.detach(),
                "grad_norm": grad_norm.detach(),
                "epsilon": self.epsilon(),
                "q_mean": q_mean.detach(),
            },
            batch_size=[],
        )
        return priority_feedback(metrics, batch, per_sample.detach())

    # ------------------------------------------------------------------ targets and optimizer
    def _collect_params(self) -> tuple[list[Tensor], list[Tensor]]:
        """The online network's parameters and the target's."""
        return list(self.online.parameters()), list(self.target.parameters())

    def _update_target(self) -> None:
        online, target = self._param_lists()
        if self._cfg["target_update"] == "soft":
            polyak_update(target, online, self._cfg["tau"])
        else:
            copy_now = (self.num_updates % self._cfg["hard_update_every"] == 0).float()
            polyak_update(target, online, copy_now)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.online.parameters(), self._cfg["lr"], eps=self._cfg["adam_eps"])

    @staticmethod
    def hidden(hidden_sizes: Sequence[int]) -> list[int]:
        return [int(w) for w in hidden_sizes]
