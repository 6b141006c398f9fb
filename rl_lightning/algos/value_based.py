"""The value-based family's one base: DQN, Double/Dueling DQN, C51 (Rainbow), QR-DQN and IQN.

A member says what its network outputs and what its loss is; everything else lives here, once:

- **hyperparameters**: the ones every member shares are one group, :class:`ValueBasedHParams` (a frozen
  dataclass of :mod:`rl_lightning.algos.hparams`, the mechanism the actor-critics share theirs by),
  validated in one place. A member's constructor takes its own arguments and ``**shared``, and is
  decorated ``@shares(ValueBasedHParams)``: Hydra's flat ``conf/algo/*.yaml`` keys, the CLI's check of
  unknown keys and ``hparams`` see every key as before;
- **acting**: epsilon-greedy on the member's Q-values (:meth:`ValueBased.q_values`), batched over envs and
  without host syncs; ``act_eval`` greedy on the deterministic estimate; ``export_policy`` that policy as a
  plain module (:meth:`ValueBased.eval_q`);
- **the update**: fresh noise for a noisy member's online and target network (independent samples, as in
  Fortunato et al. 2018), the member's per-sample loss (:meth:`ValueBased.per_sample_loss`) reduced with
  the prioritized-replay weights by :func:`~rl_lightning.algos.common.weighted_mean` (``mean(w * L)``), one
  optimizer step with gradient clipping, the target update, the metrics and the new priorities;
- **the target update**: Polyak averaging (``tau`` per update), or a copy every ``hard_update_every``
  updates as a 0/1 ``lerp_`` weight computed on the device (no Python branch on a tensor, so a CUDA graph
  holds it);
- the replay requirements: transitions, n-step returns discounted by ``gamma``, prioritized replay allowed.

Why here and not in ``base.py``: :class:`~rl_lightning.algos.base.RLModule` is the protocol every algorithm
family meets (actor-critics, TD-MPC2); this file is what the discrete value-based members share beyond it.
"""

from __future__ import annotations

import copy
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
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
    GreedyPolicy,
    LinearSchedule,
    clip_grad_norm,
    polyak_update,
    weighted_mean,
    without_grad,
)
from rl_lightning.algos.hparams import HParams, save_hparams, split_shared
from rl_lightning.nn.encoders import encoded, feature_dim, make_encoder
from rl_lightning.nn.noisy import reset_noise

__all__ = ["ValueBased", "ValueBasedHParams"]


@dataclass(frozen=True, kw_only=True)
class ValueBasedHParams(HParams):
    """The hyperparameters every value-based member shares (flat keys of ``conf/algo/*.yaml``).

    Attributes:
        hidden_sizes: widths of the network's hidden layers after the encoder's features (how a member lays
            them out, trunk and head, its docstring says).
        encoder: what reads the observation first (:mod:`rl_lightning.nn.encoders`): ``auto`` (a CNN for
            images), ``mlp``, ``nature_cnn`` or ``minatar_cnn``.
        lr: the optimizer's learning rate.
        gamma: discount, in ``(0, 1]``.
        double_dqn: choose the next action with the online network, evaluate it with the target network.
        dueling: value/advantage heads (Wang et al. 2016).
        target_update: ``soft`` (Polyak, ``tau`` per update) or ``hard`` (copy every ``hard_update_every``).
        tau: Polyak rate of soft updates, in ``(0, 1]``.
        hard_update_every: updates between copies of hard updates, ``>= 1``.
        eps_start: initial exploration rate.
        eps_end: final exploration rate (``0 <= eps_end <= eps_start <= 1``).
        eps_decay_frames: frames over which epsilon decays linearly.
        grad_clip: max gradient norm (``None``: no clipping).
        optimizer: ``adam``, or ``rmsprop``: the DQN papers' centered RMSProp (squared-gradient momentum
            0.95, ε 0.01; :meth:`RLModule.make_optimizer`), as the MinAtar paper trains.
        adam_eps: Adam's epsilon (the distributional papers use ``0.01 / batch_size``); unused by RMSProp.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    encoder: str = "auto"
    lr: float = 1e-3
    gamma: float = 0.99
    double_dqn: bool = False
    dueling: bool = False
    target_update: str = "soft"
    tau: float = 0.005
    hard_update_every: int = 1000
    eps_start: float = 1.0
    eps_end: float = 0.05
    eps_decay_frames: int = 10_000
    grad_clip: float | None = 10.0
    optimizer: str = "adam"
    adam_eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"algo.optimizer={self.optimizer!r}: choose adam or rmsprop.")
        if self.target_update not in ("soft", "hard"):
            raise ValueError(f"algo.target_update must be 'soft' or 'hard', got {self.target_update!r}.")
        if not 0.0 <= self.eps_end <= self.eps_start <= 1.0:
            raise ValueError(
                f"need 0 <= algo.eps_end ({self.eps_end}) <= algo.eps_start ({self.eps_start}) <= 1."
            )
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"algo.gamma={self.gamma} must lie in (0, 1].")
        if self.hard_update_every < 1 or not 0.0 < self.tau <= 1.0:
            raise ValueError("algo.hard_update_every must be >= 1 and algo.tau in (0, 1].")


class ValueBased(RLModule):
    """Base of DQN, C51, QR-DQN and IQN (see the module docstring).

    A member builds its networks in its constructor (:meth:`build`) and implements :meth:`q_values`,
    :meth:`eval_q` and :meth:`per_sample_loss`. A member with noisy layers sets ``self.noisy``; the update
    then draws fresh noise before the loss.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, *obs_shape]``).
        action_spec: env action spec; must be discrete (``Categorical``).
        **shared: the fields of :class:`ValueBasedHParams`; defaults where absent.

    Attributes:
        config: the shared hyperparameters (:class:`ValueBasedHParams`). ``hparams`` records them too, with
            the member's own arguments, so that a checkpoint holds every hyperparameter.
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("td_loss",)}
    #: Whether the network has noisy layers to resample before each update (a member sets it).
    noisy: bool = False
    online: nn.Module
    target: nn.Module

    def __init__(self, observation_spec: TensorSpec, action_spec: TensorSpec, **shared: Any) -> None:
        super().__init__(observation_spec, action_spec)
        name = type(self).__name__
        if not isinstance(action_spec, Categorical):
            raise IncompatibleEnvError(
                f"{name} needs a discrete action space, but the env's actions are "
                f"{type(action_spec).__name__} of shape {tuple(action_spec.shape[1:])}; use a discrete env "
                "(e.g. CartPole-v1 or HockeyVsOpponentDiscrete-v0) or an algorithm for continuous actions "
                "(SAC, TD3, AC-IQN)."
            )
        (self.config,) = split_shared(type(self), shared)
        save_hparams(self, self.config)
        self.n_actions = int(action_spec.space.n)
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        cfg = self.config
        self.epsilon_schedule = LinearSchedule(cfg.eps_start, cfg.eps_end, cfg.eps_decay_frames)

    # ------------------------------------------------------------------ what a member builds
    @property
    def hidden_sizes(self) -> list[int]:
        """``config.hidden_sizes`` as a list of ints (a config may hand any sequence)."""
        return [int(w) for w in self.config.hidden_sizes]

    def build(self, head: Callable[[int], nn.Module]) -> None:
        """Builds ``self.online``, ``head(features)`` after the observation encoder ``config.encoder``
        (:mod:`rl_lightning.nn.encoders`; none for float vectors, whose head reads the observation), and
        ``self.target``, its frozen copy."""
        torso = make_encoder(self.config.encoder, self.observation_spec["observation"])
        self.online = encoded(torso, head(feature_dim(torso, self.observation_spec["observation"])))
        self.target = copy.deepcopy(self.online).requires_grad_(False)

    # ------------------------------------------------------------------ what a member provides
    @abstractmethod
    def q_values(self, observation: Tensor, explore: bool = True) -> Tensor:
        """The (distorted) expected return of each action, ``[B, A]``, for float observations
        ``[B, *obs_shape]``.

        ``explore``: the exploring policy's estimate (noisy layers on, IQN's sampled fractions); else the
        deterministic one ``act_eval`` maximises (noise off, IQN's fixed grid, DQN's averaged network).
        """

    @abstractmethod
    def eval_q(self) -> nn.Module:
        """``q_values(·, explore=False)`` as a plain module, ``[N, *obs_shape] -> [N, A]`` (for export).

        No randomness; it shares the parameters of the network it reads.
        """

    @abstractmethod
    def per_sample_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The loss of each transition of ``batch`` (``[B]`` transitions).

        Returns:
            The per-sample losses ``[B]`` (with gradient), the new priorities ``[B]`` (read only for a
            prioritized sample, detached there) and the member's extra metrics (detached scalars, by name).
        """

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(
            discount=self.config.gamma, n_step=True, prioritized=True, sample_keys=TRANSITION_KEYS
        )

    def epsilon(self) -> Tensor:
        """The linear epsilon schedule at the frames last set (``set_frames``), on the module's device."""
        return self.epsilon_schedule.value

    # ------------------------------------------------------------------ hot paths
    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Epsilon-greedy actions ``[N]`` for observations ``[N, *obs_shape]``, without host syncs."""
        greedy = self.q_values(td.get("observation").float(), explore=True).argmax(-1)
        random = torch.randint_like(greedy, self.n_actions)
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon()
        td.set("action", torch.where(explore, random, greedy))
        return td

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """Greedy actions of the deterministic estimate."""
        td.set("action", self.q_values(td.get("observation").float(), explore=False).argmax(-1))
        return td

    def export_policy(self) -> nn.Module:
        """The greedy policy of ``act_eval``: the argmax of :meth:`eval_q`."""
        return GreedyPolicy(self.eval_q())

    def td_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """The loss of ``batch`` (``[B]`` transitions), the new priorities ``[B]`` and the extra metrics.

        The per-sample losses are reduced by :func:`~rl_lightning.algos.common.weighted_mean`: their mean,
        weighted by the importance-sampling weights ``priority_weight`` of a prioritized sample.
        """
        per_sample, priority, extra = self.per_sample_loss(batch)
        return weighted_mean(per_sample, batch.get("priority_weight", None)), priority, extra

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One step on ``batch`` (``[B]`` transitions).

        Returns:
            ``loss``, ``grad_norm``, ``epsilon`` and the member's extra metrics (scalars) and, for a
            prioritized sample, the new priorities under ``"priority"``.
        """
        if self.noisy:
            reset_noise(self.online)
            reset_noise(self.target)
        loss, priority, extra = self.td_loss(batch)
        opt = self.optimizer()
        self.clear_grads(opt)
        self.backward_loss(loss)
        if self.config.grad_clip is not None:
            grad_norm = clip_grad_norm(self._param_lists()[0], self.config.grad_clip)
        else:
            grad_norm = torch.zeros((), device=loss.device)
        opt.step()
        self.num_updates.add_(1)
        self.update_targets()
        metrics = TensorDict(
            {"loss": loss.detach(), "grad_norm": grad_norm.detach(), "epsilon": self.epsilon(), **extra},
            batch_size=[],
        )
        return priority_feedback(metrics, batch, priority)

    # ------------------------------------------------------------------ targets and optimizer
    def update_targets(self) -> None:
        """Moves the target network toward the online one: Polyak, or a copy when one is due."""
        if self.config.target_update == "soft":
            tau: float | Tensor = self.config.tau
        else:
            tau = (self.num_updates % self.config.hard_update_every == 0).float()
        online, target = self._param_lists()[:2]
        polyak_update(target, online, tau)

    def _collect_params(self) -> tuple[list[Tensor], ...]:
        """The online network's parameters and the target's (a member may add more lists after them)."""
        return list(self.online.parameters()), list(self.target.parameters())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        cfg = self.config
        eps = {"eps": cfg.adam_eps} if cfg.optimizer == "adam" else {}
        return self.make_optimizer(self.online.parameters(), cfg.lr, cfg.optimizer, **eps)
