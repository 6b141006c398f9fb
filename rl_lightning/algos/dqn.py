"""The DQN family as one LightningModule: DQN, Double DQN, Dueling, n-step, prioritized replay.

The TD loss is written on tensors here: the math of TorchRL's ``DQNLoss`` with its TD(0) estimator
(``y = r + gamma ** steps_to_next_obs * (1 - terminated) * Q_target(s', a')``, ``a'`` the target's or,
with Double DQN, the online network's greedy action; MSE or smooth-L1; prioritized samples weighted by
``priority_weight`` and normalized by the weights' sum), without its TensorDict and functional-parameter
machinery, which on a CPU cost as much again as the update of a ``[256, 256]`` network
(``benchmarks/results/dqn_overhead.json``). ``tests/algos/test_dqn.py`` checks that both give the same loss
and TD errors.
n-step returns and prioritized sampling are replay options (``replay.n_step``, ``replay.prioritized``).
Target networks move by one fused ``lerp_``: Polyak (``tau``) or a copy every ``hard_update_every`` updates
(a 0/1 weight on the device, which a CUDA graph can hold).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.data import Categorical, TensorSpec
from torchrl.modules import MLP

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
    bootstrapped_targets,
    clip_grad_norm,
    polyak_update,
)
from rl_lightning.nn.actor_critic import mlp_head
from rl_lightning.nn.encoders import encoded, feature_dim, make_encoder

__all__ = ["DQN", "DuelingHead", "GreedyPolicy", "td_targets"]


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

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[..., in_features] -> [..., n_actions]``."""
        h = self.trunk(obs)
        adv = self.advantage(h)
        return self.value(h) + adv - adv.mean(-1, keepdim=True)


def td_targets(
    q_next_target: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    steps: torch.Tensor | None = None,
    q_next_online: torch.Tensor | None = None,
) -> torch.Tensor:
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


class DQN(RLModule):
    """Deep Q-learning with the usual extensions as flags.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, *obs_shape]``).
        action_spec: env action spec; must be discrete (``Categorical``).
        hidden_sizes: widths of the Q-network's hidden layers (after the encoder's features).
        encoder: what reads the observation first (:mod:`rl_lightning.nn.encoders`): ``auto`` (a CNN for
            images), ``mlp``, ``nature_cnn`` or ``minatar_cnn``.
        lr: the optimizer's learning rate.
        gamma: discount.
        double_dqn: select the next action with the online net, evaluate it with the target net.
        dueling: value/advantage heads.
        loss: ``l2`` or ``smooth_l1``.
        target_update: ``soft`` (Polyak, ``tau`` per update) or ``hard`` (copy every ``hard_update_every``).
        tau: Polyak rate for soft updates.
        hard_update_every: updates between copies for hard updates.
        eps_start: initial exploration rate.
        eps_end: final exploration rate.
        eps_decay_frames: frames over which epsilon decays linearly.
        grad_clip: max gradient norm (``None``: no clipping).
        eval_polyak: the deterministic policy (evaluation, export) acts with a Polyak average of the online
            network, moved toward it by this rate after every update (``None``: the online network itself).
            The greedy policy of a Q-network flips between good and bad as the network moves; the average
            moves slowly, so the last policy of a run is not the luck of its last update.
        optimizer: ``adam``, or ``rmsprop``: the DQN papers' centered RMSProp (squared-gradient momentum
            0.95, ε 0.01; :meth:`RLModule.make_optimizer`), as the MinAtar paper trains.
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("td_loss",)}
    legacy_state_keys: ClassVar[dict[str, str]] = {"eps_bounds": "epsilon_schedule.bounds"}
    #: Versions built on TorchRL's ``DQNLoss`` named the networks differently; their actor shared its weights
    #: with the loss, which also held the estimator's gamma.
    legacy_state_prefixes: ClassVar[dict[str, str | None]] = {
        "loss_module.value_network_params.module.0.module.": "q_net.",
        "loss_module.target_value_network_params.module.0.module.": "target_q_net.",
        "qnet.": None,
        "loss_module.": None,
    }

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        hidden_sizes: Sequence[int] = (256, 256),
        encoder: str = "auto",
        lr: float = 1e-3,
        gamma: float = 0.99,
        double_dqn: bool = False,
        dueling: bool = False,
        loss: str = "l2",
        target_update: str = "soft",
        tau: float = 0.005,
        hard_update_every: int = 1000,
        eps_start: float = 1.0,
        eps_end: float = 0.05,
        eps_decay_frames: int = 10_000,
        grad_clip: float | None = 10.0,
        eval_polyak: float | None = None,
        optimizer: str = "adam",
    ) -> None:
        super().__init__(observation_spec, action_spec)
        if not isinstance(action_spec, Categorical):
            raise IncompatibleEnvError(
                f"DQN needs a discrete action space, but the env's actions are {type(action_spec).__name__} "
                f"of shape {tuple(action_spec.shape[1:])}; use a discrete env "
                "(e.g. HockeyVsOpponentDiscrete-v0) "
                "or an algorithm for continuous actions."
            )
        if optimizer not in ("adam", "rmsprop"):
            raise ValueError(f"algo.optimizer={optimizer!r}: choose adam or rmsprop.")
        if target_update not in ("soft", "hard"):
            raise ValueError(f"target_update must be 'soft' or 'hard', got {target_update!r}.")
        if loss not in ("l2", "smooth_l1"):
            raise ValueError(f"loss must be 'l2' or 'smooth_l1', got {loss!r}.")
        if not 0.0 <= eps_end <= eps_start <= 1.0:
            raise ValueError(f"need 0 <= algo.eps_end ({eps_end}) <= algo.eps_start ({eps_start}) <= 1.")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"algo.gamma={gamma} must lie in (0, 1].")
        if eval_polyak is not None and not 0.0 < eval_polyak <= 1.0:
            raise ValueError(f"algo.eval_polyak={eval_polyak} must lie in (0, 1] (or null: no average).")
        # Not logged: the run's resolved config is logged once, flattened.
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"], logger=False)
        self.n_actions = int(action_spec.space.n)
        torso = make_encoder(encoder, observation_spec["observation"])
        features = feature_dim(torso, observation_spec["observation"])
        if dueling:
            head: nn.Module = DuelingHead(features, hidden_sizes, self.n_actions)
        else:
            head = mlp_head(features, self.n_actions, hidden_sizes)  # TorchRL MLP's layers and names
        self.q_net = encoded(torso, head)
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        #: The Polyak average the deterministic policy acts with (``eval_polyak``), else the online network.
        self.eval_q_net = copy.deepcopy(self.q_net).requires_grad_(False) if eval_polyak else None
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self.epsilon_schedule = LinearSchedule(eps_start, eps_end, eps_decay_frames)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """A checkpoint written without the averaged network (before ``eval_polyak``, or with it off) starts
        the average at its online network."""
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("state_dict", {})
        if self.eval_q_net is not None and not any(k.startswith("eval_q_net.") for k in state):
            for key in self.eval_q_net.state_dict():
                state[f"eval_q_net.{key}"] = state[f"q_net.{key}"].clone()

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(
            discount=self.hparams.gamma, n_step=True, prioritized=True, sample_keys=TRANSITION_KEYS
        )

    def epsilon(self) -> torch.Tensor:
        """The linear epsilon schedule at the frames last set (``set_frames``), on the module's device."""
        return self.epsilon_schedule.value

    # ------------------------------------------------------------------ hot paths
    def q_values(self, observation: torch.Tensor) -> torch.Tensor:
        """Q-values ``[..., n_actions]`` for observations ``[..., *obs_shape]``."""
        return self.q_net(observation.float())

    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Epsilon-greedy actions ``[N]`` for observations ``[N, obs_dim]``, without host syncs."""
        q = self.q_values(td.get("observation"))
        greedy = q.argmax(-1)
        random = torch.randint_like(greedy, self.n_actions)
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon()
        td.set("action", torch.where(explore, random, greedy))
        return td

    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """Greedy actions (of the averaged network with ``eval_polyak``)."""
        net = self.eval_q_net if self.eval_q_net is not None else self.q_net
        td.set("action", net(td.get("observation").float()).argmax(-1))
        return td

    def export_policy(self) -> nn.Module:
        """The greedy policy over the Q-network ``act_eval`` uses."""
        return GreedyPolicy(self.eval_q_net if self.eval_q_net is not None else self.q_net)

    def td_loss(self, batch: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """The TD loss of ``batch`` (``[B]`` transitions) and the TD errors ``|Q(s, a) - y|``, ``[B]``."""
        nxt = batch.get("next")
        q = self.q_values(batch.get("observation")).gather(-1, batch.get("action").view(-1, 1)).squeeze(-1)
        with torch.no_grad():
            next_obs = nxt.get("observation").float()
            online = self.q_net(next_obs) if self.hparams.double_dqn else None
            steps = batch.get("steps_to_next_obs", None)
            target = td_targets(
                self.target_q_net(next_obs),
                nxt.get("reward").reshape(q.shape).to(q.dtype),
                nxt.get("terminated").reshape(q.shape),
                self.hparams.gamma,
                None if steps is None else steps.reshape(q.shape),
                online,
            )
        if self.hparams.loss == "l2":
            per_sample = F.mse_loss(q, target, reduction="none")
        else:
            per_sample = F.smooth_l1_loss(q, target, reduction="none")
        weight = batch.get("priority_weight", None)
        if weight is None:
            loss = per_sample.mean()
        else:  # TorchRL's weighted reduction: sum(w * L) / sum(w)
            weight = weight.reshape(q.shape).to(q.dtype)
            loss = (per_sample * weight).sum() / weight.sum()
        return loss, (q - target).detach().abs()

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One Q-learning step on ``batch`` (``[B]`` transitions).

        Returns:
            ``loss``, ``grad_norm`` and ``epsilon`` (scalars) and, for a prioritized sample, the new
            priorities ``|TD error|`` under ``"priority"``.
        """
        opt = self.optimizer()
        loss, td_error = self.td_loss(batch)
        self.clear_grads(opt)
        self.backward_loss(loss)
        if self.hparams.grad_clip is not None:
            grad_norm = clip_grad_norm(self._param_lists()[0], self.hparams.grad_clip)
        else:
            grad_norm = torch.zeros((), device=loss.device)
        opt.step()
        self.num_updates.add_(1)
        self._update_target()
        if self.eval_q_net is not None:
            online, _, averaged = self._param_lists()
            polyak_update(averaged, online, self.hparams.eval_polyak)
        metrics = TensorDict(
            {"loss": loss.detach(), "grad_norm": grad_norm.detach(), "epsilon": self.epsilon()}, batch_size=[]
        )
        return priority_feedback(metrics, batch, td_error)

    def _update_target(self) -> None:
        if self.hparams.target_update == "soft":
            tau = self.hparams.tau
        else:
            tau = (self.num_updates % self.hparams.hard_update_every == 0).float()
        online, target, _ = self._param_lists()
        polyak_update(target, online, tau)

    def _collect_params(self) -> tuple[list[torch.Tensor], ...]:
        """The Q-network's parameters, the target network's and the averaged network's (or none)."""
        averaged = list(self.eval_q_net.parameters()) if self.eval_q_net is not None else []
        return list(self.q_net.parameters()), list(self.target_q_net.parameters()), averaged

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.q_net.parameters(), self.hparams.lr, self.hparams.optimizer)
