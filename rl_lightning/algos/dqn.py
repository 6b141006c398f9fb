"""The DQN family as one LightningModule: DQN, Double DQN, Dueling, n-step, prioritized replay.

The loss is TorchRL's ``DQNLoss`` (TD(0) estimator; with n-step replay the estimator discounts by
``gamma ** steps_to_next_obs``) and target networks follow TorchRL's ``SoftUpdate``/``HardUpdate``.
n-step returns and prioritized sampling are replay options (``replay.n_step``, ``replay.prioritized``):
the loss reads the sampled importance weights and writes ``td_error`` for the priority update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.data import Categorical, TensorSpec
from torchrl.modules import MLP, QValueActor
from torchrl.objectives import DQNLoss, SoftUpdate, ValueEstimators

from rl_lightning.algos.base import IncompatibleEnvError, ReplayRequirements, RLModule, priority_feedback
from rl_lightning.algos.common import LinearSchedule, polyak_update

__all__ = ["DQN", "DuelingHead", "GreedyPolicy"]


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


class GreedyPolicy(nn.Module):
    """``observation [N, obs_dim] -> argmax_a Q(s, a) [N]``: DQN's deterministic policy for export."""

    def __init__(self, q_net: nn.Module) -> None:
        super().__init__()
        self.q_net = q_net

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.q_net(observation.float()).argmax(-1)


class DQN(RLModule):
    """Deep Q-learning with the usual extensions as flags.

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be discrete (``Categorical``).
        hidden_sizes: widths of the Q-network's hidden layers.
        lr: Adam learning rate.
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
    """

    cuda_graph_safe = ("update", "act")
    legacy_state_keys: ClassVar[dict[str, str]] = {"eps_bounds": "epsilon_schedule.bounds"}

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        hidden_sizes: Sequence[int] = (256, 256),
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
    ) -> None:
        super().__init__(observation_spec, action_spec)
        if not isinstance(action_spec, Categorical):
            raise IncompatibleEnvError(
                f"DQN needs a discrete action space, but the env's actions are {type(action_spec).__name__} "
                f"of shape {tuple(action_spec.shape[1:])}; use a discrete env "
                "(e.g. HockeyVsOpponentDiscrete-v0) "
                "or an algorithm for continuous actions."
            )
        if target_update not in ("soft", "hard"):
            raise ValueError(f"target_update must be 'soft' or 'hard', got {target_update!r}.")
        if loss not in ("l2", "smooth_l1"):
            raise ValueError(f"loss must be 'l2' or 'smooth_l1', got {loss!r}.")
        if not 0.0 <= eps_end <= eps_start <= 1.0:
            raise ValueError(f"need 0 <= algo.eps_end ({eps_end}) <= algo.eps_start ({eps_start}) <= 1.")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"algo.gamma={gamma} must lie in (0, 1].")
        self.save_hyperparameters(ignore=["observation_spec", "action_spec"])
        self.n_actions = int(action_spec.space.n)
        obs_dim = int(torch.Size(self.obs_shape).numel())
        if dueling:
            net = DuelingHead(obs_dim, hidden_sizes, self.n_actions)
        else:
            net = MLP(
                in_features=obs_dim,
                out_features=self.n_actions,
                num_cells=list(hidden_sizes),
                activation_class=nn.ReLU,
            )
        single_spec = Categorical(self.n_actions, dtype=torch.int64)
        self.qnet = QValueActor(net, in_keys=["observation"], spec=single_spec, action_space="categorical")
        self.loss_module = DQNLoss(
            self.qnet,
            loss_function=loss,
            delay_value=True,
            double_dqn=double_dqn,
            action_space=single_spec,
        )
        self.loss_module.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
        # Soft updates reuse TorchRL's SoftUpdate (a lerp_ per parameter). Hard updates are a lerp_ with a
        # weight of 1 every k-th update and 0 otherwise: TorchRL's HardUpdate copies every k+1 updates,
        # keeps its counter outside the state dict and branches in Python, which a CUDA graph cannot hold.
        self.target_updater = SoftUpdate(self.loss_module, tau=tau) if target_update == "soft" else None
        self.register_buffer("num_updates", torch.zeros((), dtype=torch.long))
        self.epsilon_schedule = LinearSchedule(eps_start, eps_end, eps_decay_frames)
        self._params_cache: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Transitions; n-step returns discounted by ``gamma``; prioritized replay allowed."""
        return ReplayRequirements(discount=self.hparams.gamma, n_step=True, prioritized=True)

    def epsilon(self) -> torch.Tensor:
        """Linear epsilon schedule over frames, computed on the module's device."""
        return self.epsilon_schedule(self.frames)

    # ------------------------------------------------------------------ hot paths
    def q_values(self, observation: torch.Tensor) -> torch.Tensor:
        """Q-values ``[..., n_actions]`` for observations ``[..., obs_dim]``."""
        return self.qnet.module[0].module(observation.float())

    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Epsilon-greedy actions ``[N]`` for observations ``[N, obs_dim]``, without host syncs."""
        q = self.q_values(td.get("observation"))
        greedy = q.argmax(-1)
        random = torch.randint_like(greedy, self.n_actions)
        explore = torch.rand(greedy.shape, device=greedy.device) < self.epsilon()
        td.set("action", torch.where(explore, random, greedy))
        return td

    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """Greedy actions."""
        td.set("action", self.q_values(td.get("observation")).argmax(-1))
        return td

    def export_policy(self) -> nn.Module:
        """The greedy policy over the online Q-network (what ``act_eval`` does)."""
        return GreedyPolicy(self.qnet.module[0].module)

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One Q-learning step on ``batch`` (``[B]`` transitions).

        Returns:
            ``loss``, ``grad_norm`` and ``epsilon`` (scalars) and, for a prioritized sample, the new
            priorities ``|TD error|`` under ``"priority"``.
        """
        opt = self.optimizer()
        losses = self.loss_module(batch)
        loss = losses.get("loss")
        opt.zero_grad(set_to_none=False)
        self.backward_loss(loss)
        if self.hparams.grad_clip is not None:
            grad_norm = nn.utils.clip_grad_norm_(self._param_lists()[0], self.hparams.grad_clip)
        else:
            grad_norm = torch.zeros((), device=loss.device)
        opt.step()
        self.num_updates.add_(1)
        self._update_target()
        metrics = TensorDict(
            {"loss": loss.detach(), "grad_norm": grad_norm.detach(), "epsilon": self.epsilon()}, batch_size=[]
        )
        # TorchRL's DQNLoss writes the squared TD error; PER's priorities are |TD error|.
        return priority_feedback(metrics, batch, batch.get("td_error").sqrt())

    def _param_lists(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        # Walking the TensorDictParams costs more than the update of a small net on a CPU: cache the
        # leaves, and drop the cache whenever the module moves (see ``_apply``).
        if self._params_cache is None:
            self._params_cache = (
                list(self.loss_module.value_network_params.values(True, True)),
                list(self.loss_module.target_value_network_params.values(True, True)),
            )
        return self._params_cache

    def _apply(self, fn, recurse: bool = True):
        self._params_cache = None
        return super()._apply(fn, recurse)

    def _update_target(self) -> None:
        if self.target_updater is not None:
            self.target_updater.step()
            return
        copy = (self.num_updates % self.hparams.hard_update_every == 0).float()
        sources, targets = self._param_lists()
        polyak_update(targets, sources, copy)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.make_optimizer(self.loss_module.value_network_params.values(True, True), self.hparams.lr)
