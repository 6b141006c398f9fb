"""DQN, Double DQN, Dueling, n-step, prioritized replay: the Q-network and its TD loss.

Acting, the update, the target network and the hyperparameters shared with the distributional members are
:class:`~rl_lightning.algos.value_based.ValueBased`'s; this file holds the network and the loss.

The TD loss is written on tensors here: the math of TorchRL's ``DQNLoss`` with its TD(0) estimator
(``y = r + gamma ** steps_to_next_obs * (1 - terminated) * Q_target(s', a')``, ``a'`` the target's or,
with Double DQN, the online network's greedy action; MSE or smooth-L1), without its TensorDict and
functional-parameter machinery, which on a CPU cost as much again as the update of a ``[256, 256]`` network
(``benchmarks/results/dqn_overhead.json``). ``tests/algos/test_dqn.py`` checks that both give the same loss
and TD errors. Prioritized samples are weighted as in every algorithm here, ``mean(w * L)``
(:func:`~rl_lightning.algos.common.weighted_mean`; TorchRL divides by ``sum(w)`` instead).
n-step returns and prioritized sampling are replay options (``replay.n_step``, ``replay.prioritized``).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import TensorSpec
from torchrl.modules import MLP

from rl_lightning.algos.common import GreedyPolicy, bootstrapped_targets, polyak_update
from rl_lightning.algos.hparams import shares
from rl_lightning.algos.value_based import ValueBased, ValueBasedHParams
from rl_lightning.nn.actor_critic import mlp_head

__all__ = ["DQN", "DuelingHead", "GreedyPolicy", "ValueBasedHParams", "td_targets"]


class DuelingHead(nn.Module):
    """Dueling Q-network (Wang et al. 2016): ``Q = V + A - mean(A)`` over a shared MLP trunk.

    TorchRL's dueling networks are convolutional; this is the MLP form.

    Args:
        in_features: observation size.
        hidden_sizes: trunk widths; the value and advantage heads each get one more layer of the last width.
        n_actions: number of discrete actions.
    """

    def __init__(self, in_features: int, hidden_sizes: Sequence[int], n_actions: int) -> None:
        super().__init__()
        self.trunk = MLP(
            in_features=in_features,
            out_features=hidden_sizes[-1],
            num_cells=list(hidden_sizes[:-1]),
            activation_class=nn.ReLU,
            activate_last_layer=True,
        )
        width = hidden_sizes[-1]
        self.value = MLP(in_features=width, out_features=1, num_cells=[width], activation_class=nn.ReLU)
        self.advantage = MLP(
            in_features=width, out_features=n_actions, num_cells=[width], activation_class=nn.ReLU
        )

    def forward(self, obs: Tensor) -> Tensor:
        """``[..., in_features] -> [..., n_actions]``."""
        h = self.trunk(obs)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(-1, keepdim=True)


def td_targets(
    q_next_target: Tensor,
    reward: Tensor,
    terminated: Tensor,
    gamma: float,
    steps: Tensor | None = None,
    q_next_online: Tensor | None = None,
) -> Tensor:
    """TD(0) targets ``r + gamma ** steps * (1 - terminated) * Q_target(s', a')``, ``[B]``.

    Args:
        q_next_target: target network's Q-values at the next observations, ``[B, A]``.
        reward: ``[B]`` (n-step: the discounted sum of the window's rewards).
        terminated: ``[B]`` bool; no bootstrap past a terminal state (a truncation still bootstraps).
        gamma: discount.
        steps: ``[B]`` steps to the next observation (n-step windows); ``None`` means one.
        q_next_online: online Q-values at the next observations ``[B, A]`` for Double DQN (``a'`` is
            their argmax); ``None``: ``a'`` is the target network's argmax.
    """
    if q_next_online is None:
        bootstrap = q_next_target.max(-1).values
    else:
        bootstrap = q_next_target.gather(-1, q_next_online.argmax(-1, keepdim=True)).squeeze(-1)
    return bootstrapped_targets(reward, terminated, bootstrap, gamma, steps)


@shares(ValueBasedHParams)
class DQN(ValueBased):
    """Deep Q-learning with the usual extensions as flags (``double_dqn``, ``dueling`` of the shared config).

    The network maps observations to one Q-value per action (:class:`DuelingHead` with ``dueling``); the
    loss of a transition is ``ℓ(Q(s, a), y)`` for the TD target ``y`` of :func:`td_targets`.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, *obs_shape]``).
        action_spec: env action spec; must be discrete (``Categorical``).
        loss: ``l2`` or ``smooth_l1``.
        eval_polyak: the deterministic policy (evaluation, export) acts with a Polyak average of the online
            network, moved toward it by this rate after every update (``None``: the online network itself).
            The greedy policy of a Q-network flips between good and bad as the network moves; the average
            moves slowly, so the last policy of a run is not the luck of its last update.
        **shared: the family's hyperparameters, :class:`~rl_lightning.algos.value_based.ValueBasedHParams`.
    """

    #: Older names of the state: the networks were ``q_net``, ``target_q_net`` and ``eval_q_net``; versions
    #: built on TorchRL's ``DQNLoss`` named them differently again, their actor shared its weights with the
    #: loss, which also held the estimator's gamma.
    legacy_state_keys: ClassVar[dict[str, str]] = {"eps_bounds": "epsilon_schedule.bounds"}
    legacy_state_prefixes: ClassVar[dict[str, str | None]] = {
        "q_net.": "online.",
        "target_q_net.": "target.",
        "eval_q_net.": "averaged.",
        "loss_module.value_network_params.module.0.module.": "online.",
        "loss_module.target_value_network_params.module.0.module.": "target.",
        "qnet.": None,
        "loss_module.": None,
    }

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        loss: str = "l2",
        eval_polyak: float | None = None,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec, **shared)
        if loss not in ("l2", "smooth_l1"):
            raise ValueError(f"algo.loss must be 'l2' or 'smooth_l1', got {loss!r}.")
        if eval_polyak is not None and not 0.0 < eval_polyak <= 1.0:
            raise ValueError(f"algo.eval_polyak={eval_polyak} must lie in (0, 1] (or null: no average).")
        self.loss_fn = F.mse_loss if loss == "l2" else F.smooth_l1_loss
        self.eval_polyak = eval_polyak
        hidden, n = self.hidden_sizes, self.n_actions
        if self.config.dueling:
            self.build(lambda f: DuelingHead(f, hidden, n))
        else:
            self.build(lambda f: mlp_head(f, n, hidden))  # TorchRL MLP's layers and names
        #: The Polyak average the deterministic policy acts with (``eval_polyak``), else ``None``.
        self.averaged = copy.deepcopy(self.online).requires_grad_(False) if eval_polyak else None

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint written without the averaged network (before ``eval_polyak``, or with it off) starts
        the average at its online network."""
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("state_dict", {})
        if self.averaged is not None and not any(k.startswith("averaged.") for k in state):
            for key in self.averaged.state_dict():
                state[f"averaged.{key}"] = state[f"online.{key}"].clone()

    def q_values(self, observation: Tensor, explore: bool = True) -> Tensor:
        """Q-values ``[..., n_actions]`` for observations ``[..., *obs_shape]``; not exploring, those of the
        averaged network with ``eval_polyak``."""
        net = self.online if explore or self.averaged is None else self.averaged
        return net(observation.float())

    def eval_q(self) -> nn.Module:
        return self.online if self.averaged is None else self.averaged

    def per_sample_loss(self, batch: TensorDictBase) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """``ℓ(Q(s, a), y)`` per transition ``[B]``; the TD errors ``|Q(s, a) - y|`` as priorities."""
        nxt = batch.get("next")
        q = self.q_values(batch.get("observation")).gather(-1, batch.get("action").view(-1, 1)).squeeze(-1)
        with torch.no_grad():
            next_obs = nxt.get("observation").float()
            online = self.online(next_obs) if self.config.double_dqn else None
            steps = batch.get("steps_to_next_obs", None)
            target = td_targets(
                self.target(next_obs),
                nxt.get("reward").reshape(q.shape).to(q.dtype),
                nxt.get("terminated").reshape(q.shape),
                self.config.gamma,
                None if steps is None else steps.reshape(q.shape),
                online,
            )
        return self.loss_fn(q, target, reduction="none"), (q - target).detach().abs(), {}

    def update_targets(self) -> None:
        """The target network's update, then the averaged network's (``eval_polyak``)."""
        super().update_targets()
        if self.averaged is not None:
            online, _, averaged = self._param_lists()
            polyak_update(averaged, online, self.eval_polyak)

    def _collect_params(self) -> tuple[list[Tensor], ...]:
        """The online network's parameters, the target's and the averaged network's (or none)."""
        averaged = list(self.averaged.parameters()) if self.averaged is not None else []
        return (*super()._collect_params(), averaged)
