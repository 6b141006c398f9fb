"""TD-MPC2 (Hansen, Su, Wang, ICLR 2024) as a LightningModule: a latent world model learned from
sub-trajectories and an MPPI planner that acts with it.

Data: the replay buffer samples sub-trajectories with TorchRL's ``SliceSampler``; the module asks for
slices of ``horizon`` steps through its replay requirements (``replay.slice_len`` follows). Each TorchRL
row is a whole transition (``observation``, ``action``, ``("next", ...)``), so ``H`` consecutive rows
carry the ``H + 1`` observations, ``H`` actions and rewards of the reference's ``H + 1``-step slices. The
collector's first ``max(1000, 5 * episode_length)`` frames are random; ``collect.warmup_burst`` then
grants one burst of as many updates (the reference's seeding).

One ``update``: world-model loss (consistency, reward, value, termination; ``rho ** t`` weighted) and
Adam step with the encoder at ``enc_lr_scale * lr`` and gradient clipping; policy-prior loss on the
detached latent rollout and its own Adam step; Polyak update of the target Q-ensemble (one ``lerp_``).

Acting (world model in eval mode, as in the reference): ``act`` plans for every training env at once
(warm start per env, reset where ``step_count`` is 0, exploration noise); ``act_eval`` plans without noise
and returns the plan's mean first action, with a warm-start buffer per evaluation batch size. Actions are
planned in ``[-1, 1]`` and mapped affinely to the env's bounds (stored actions are mapped back in
``update``).

The losses, world model and planner live in their own files (no TorchRL loss or planner fits TD-MPC2,
see their docstrings); this module wires them to the framework's protocol.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor, nn
from torchrl.data import TensorSpec

from rl_lightning.algos.base import ReplayRequirements, RLModule
from rl_lightning.algos.common import ActionScaler, clip_grad_norm, episode_start, without_grad
from rl_lightning.algos.hparams import save_hparams, shares, split_shared, vector_obs_dim
from rl_lightning.algos.tdmpc2.losses import (
    LossSettings,
    ModelLossOutput,
    TDMPC2Batch,
    TDMPC2Loss,
    batch_from_tensordict,
    model_param_groups,
)
from rl_lightning.algos.tdmpc2.math import discount_from_episode_length
from rl_lightning.algos.tdmpc2.planner import MPPIPlanner, PlannerSettings
from rl_lightning.algos.tdmpc2.world_model import MODEL_SIZES, WorldModel, model_size_preset
from rl_lightning.nn.layers import eval_mode as model_eval_mode

__all__ = ["TDMPC2", "parse_model_size"]


class _PriorPolicy(nn.Module):
    """``observation -> tanh(mean)`` of the policy prior, mapped to the env's bounds (for export)."""

    def __init__(self, model: WorldModel, actions: ActionScaler) -> None:
        super().__init__()
        self.encoder, self.pi_net, self.actions = model.encoder, model.pi_net, actions

    def forward(self, observation: Tensor) -> Tensor:
        mu, _ = self.pi_net(self.encoder(observation.float())).chunk(2, dim=-1)
        return self.actions.to_env(torch.tanh(mu))


def parse_model_size(size: str | int) -> int:
    """``"5M"``, ``"5m"``, ``"5"`` or ``5`` -> 5 (the key of the reference presets)."""
    text = str(size).strip().upper().removesuffix("M")
    if not text.isdigit() or int(text) not in MODEL_SIZES:
        names = ", ".join(f"{k}M" for k in MODEL_SIZES)
        raise ValueError(f"algo.model_size={size!r} is not a TD-MPC2 preset; choose one of {names}.")
    return int(text)


@shares(PlannerSettings, LossSettings)
class TDMPC2(RLModule):
    """TD-MPC2 for vector observations and bounded continuous actions (single task).

    Args:
        observation_spec: env observation spec (``observation`` of shape ``[N, obs_dim]``).
        action_spec: env action spec; must be ``Bounded`` (continuous, finite bounds).
        model_size: reference size preset ``"1M"``, ``"5M"``, ``"19M"``, ``"48M"`` or ``"317M"``.
        latent_dim: overrides the preset's latent size (``None`` keeps it).
        mlp_dim: overrides the preset's hidden width.
        enc_dim: overrides the preset's encoder width.
        num_q: overrides the preset's Q-ensemble size.
        episode_length: the env's (maximum) episode length; sets the discount when ``discount`` is None.
        discount: γ; ``None`` derives it from ``episode_length`` as in the paper.
        episodic: learn a termination head and stop bootstrapping at terminal states.
        num_envs: training envs planned for in one ``act`` call (the warm-start buffer's size).
        mpc: act with the MPPI planner; ``False`` acts with the policy prior alone.
        plan_training: with ``mpc``, plan in ``act`` (collection) too; ``False`` collects with the policy
            prior's sampled actions and plans only in ``act_eval`` (a frame then costs no planning).
        lr: Adam learning rate of world model and policy.
        enc_lr_scale: encoder learning-rate multiplier.
        grad_clip: max gradient norm of each of the two updates.
        tau: Polyak rate of the target Q-ensemble.
        **shared: the planner's settings (:class:`~rl_lightning.algos.tdmpc2.planner.PlannerSettings`:
            ``horizon``, the planning and training horizon ``H`` (the replay samples slices of ``H``
            steps), ``iterations``, ``num_samples``, ...) and the losses' weights
            (:class:`~rl_lightning.algos.tdmpc2.losses.LossSettings`: ``rho``, the coefficients,
            ``target_entropy``, learned as SAC learns its temperature, meant for a prior that acts alone,
            ``mpc=False``, which the fixed 1e-4 lets collapse onto near-deterministic actions); defined
            once there and passed down to every planner and to the loss.
    """

    cuda_graph_safe = ("update", "act")
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {"update": ("world_model_loss", "policy_loss")}
    ddp_find_unused_parameters = True  # the world-model and the policy losses touch disjoint parameters
    legacy_state_keys: ClassVar[dict[str, str]] = {
        "action_scale": "actions.scale",
        "action_bias": "actions.bias",
        "planner.prev_mean": "planner.warm_start.value",
    }

    def __init__(
        self,
        observation_spec: TensorSpec,
        action_spec: TensorSpec,
        model_size: str | int = "5M",
        latent_dim: int | None = None,
        mlp_dim: int | None = None,
        enc_dim: int | None = None,
        num_q: int | None = None,
        episode_length: int = 1000,
        discount: float | None = None,
        episodic: bool = False,
        num_envs: int = 1,
        mpc: bool = True,
        plan_training: bool = True,
        lr: float = 3e-4,
        enc_lr_scale: float = 0.3,
        grad_clip: float = 20.0,
        tau: float = 0.01,
        **shared: Any,
    ) -> None:
        super().__init__(observation_spec, action_spec)
        # Affine map between the planner's [-1, 1] and the env's bounds (rejects unbounded actions).
        self.actions = ActionScaler(action_spec, "TD-MPC2")
        if episode_length < 1 or num_envs < 1:
            raise ValueError("episode_length and num_envs must be >= 1.")
        if grad_clip <= 0:
            raise ValueError(f"grad_clip={grad_clip} must be > 0 (the reference clips at 20).")
        self.plan_settings, loss_settings = split_shared(type(self), shared)
        save_hparams(self, self.plan_settings, loss_settings)
        obs_dim = vector_obs_dim(self, "TD-MPC2 here")
        self.action_dim = self.actions.action_dim
        self.horizon = self.plan_settings.horizon
        self.discount = discount_from_episode_length(episode_length) if discount is None else discount

        overrides = {"latent_dim": latent_dim, "mlp_dim": mlp_dim, "enc_dim": enc_dim, "num_q": num_q}
        arch = {
            **model_size_preset(parse_model_size(model_size)),
            **{k: v for k, v in overrides.items() if v is not None},
        }
        self.model = WorldModel(obs_dim, self.action_dim, episodic=episodic, tau=tau, **arch)
        self.loss_fn = TDMPC2Loss(self.discount, loss_settings)
        self.planner = self._make_planner(num_envs)
        # Evaluation planners, one per eval batch size, created on first use. They are kept out of the
        # module tree (and so out of checkpoints): every evaluation starts its episodes from step 0, where
        # the warm start is cleared anyway.
        self._eval_planners: dict[int, MPPIPlanner] = {}

    def _make_planner(self, num_envs: int) -> MPPIPlanner:
        return MPPIPlanner(
            self.action_dim, num_envs=num_envs, discount=self.discount, settings=self.plan_settings
        )

    # ------------------------------------------------------------------ protocol
    def replay_requirements(self) -> ReplayRequirements:
        """Sub-trajectories of ``horizon`` steps (``H + 1`` observations); no n-step returns, no PER."""
        return ReplayRequirements(slice_len=self.horizon, discount=self.discount)

    # ------------------------------------------------------------------ hot paths
    def _plan(self, td: TensorDictBase, planner: MPPIPlanner, eval_mode: bool) -> TensorDictBase:
        # The reference plans with the world model in eval mode (no Q dropout), in training too.
        with model_eval_mode(self.model):
            z = self.model.encode(td.get("observation").float())
            if self.hparams.mpc and (eval_mode or self.hparams.plan_training):
                action = planner(self.model, z, t0=episode_start(td), eval_mode=eval_mode)
            else:
                pi = self.model.pi(z)
                action = pi.mean if eval_mode else pi.action
        td.set("action", self.actions.to_env(action))
        return td

    @without_grad
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """Plans with exploration noise for the ``[N]`` training envs; writes ``action [N, A]``."""
        n = td.batch_size[0] if td.batch_dims else 1
        if n != self.planner.num_envs:
            raise ValueError(
                f"act got {n} envs but the planner was built for algo.num_envs={self.planner.num_envs}; "
                "set algo.num_envs to env.num_envs (the default interpolation does)."
            )
        return self._plan(td, self.planner, eval_mode=False)

    def export_policy(self) -> nn.Module:
        """The policy prior's mean action in the env's units (``act_eval`` when ``mpc=False``).

        Raises:
            NotImplementedError: with ``mpc=True`` the deterministic policy is the MPPI planner, which keeps
                a warm start per env and samples action sequences: not a function of the observation alone.
        """
        if self.hparams.mpc:
            raise NotImplementedError(
                "TD-MPC2 acts by planning (algo.mpc=true): the planner keeps a warm start per env and "
                "samples action sequences, so it is no function of the observation alone; export a run "
                "trained with algo.mpc=false, or load the checkpoint with the framework to plan."
            )
        return _PriorPolicy(self.model, self.actions)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Older names first (the base's); then a collection planner's warm start of another horizon (a
        checkpoint evaluated with ``planner.horizon=...``) starts cold: it is the last plan's mean, state of
        the collection, not a weight."""
        super().on_load_checkpoint(checkpoint)
        state, key = checkpoint.get("state_dict", {}), "planner.warm_start.value"
        if key in state and state[key].shape != self.planner.prev_mean.shape:
            state[key] = torch.zeros_like(self.planner.prev_mean)

    def snapshot_policy(self) -> nn.Module:
        """The policy prior's mean action, planning or not: a self-play opponent acts without a planner."""
        return _PriorPolicy(self.model, self.actions)

    @without_grad
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """Plans without exploration noise (mean first action); any number of envs ``[N]``."""
        n = td.batch_size[0] if td.batch_dims else 1
        planner = self._eval_planners.get(n)
        if planner is None or planner.prev_mean.device != self.device:
            planner = self._eval_planners[n] = self._make_planner(n).to(self.device)
        return self._plan(td, planner, eval_mode=True)

    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One TD-MPC2 update on ``batch``: ``[B * H]`` rows, ``B`` consecutive slices of ``H`` steps.

        Returns:
            Detached scalars: ``consistency_loss``, ``reward_loss``, ``value_loss``, ``termination_loss``,
            ``total_loss``, ``grad_norm``, ``pi_loss``, ``pi_grad_norm``, ``pi_entropy``, ``pi_scale``,
            ``pi_log_std``, ``pi_entropy_coef``.
        """
        opt, pi_opt = self.optimizer(0), self.optimizer(1)
        data = batch_from_tensordict(batch.reshape(-1, self.horizon))
        terminated = data.terminated if self.hparams.episodic else torch.zeros_like(data.terminated)
        data = data._replace(action=self.actions.from_env(data.action), terminated=terminated)

        # Losses in train mode (Q dropout), as in the reference. Its TD targets are computed in eval mode,
        # which is the same here: the target ensemble never uses dropout and the policy has none.
        out = self.world_model_loss(data)
        self.clear_grads(opt)
        self.backward_loss(out.loss)
        grad_norm = clip_grad_norm(self._model_params, self.hparams.grad_clip)
        opt.step()

        pi_loss, pi_metrics = self.policy_loss(out.zs.detach())
        self.clear_grads(pi_opt)
        self.backward_loss(pi_loss)
        pi_grad_norm = clip_grad_norm(self.model.pi_net.parameters(), self.hparams.grad_clip)
        pi_opt.step()
        self.model.soft_update_target_Q()
        metrics = {**out.metrics, **pi_metrics, "grad_norm": grad_norm, "pi_grad_norm": pi_grad_norm}
        return TensorDict({k: v.detach() for k, v in metrics.items()}, batch_size=[])

    def world_model_loss(self, data: TDMPC2Batch) -> ModelLossOutput:
        """The world model's loss on ``data`` (``TDMPC2Loss.model_loss``)."""
        return self.loss_fn.model_loss(self.model, data)

    def policy_loss(self, zs: Tensor) -> tuple[Tensor, dict[str, Tensor]]:
        """The policy prior's loss on the latent states ``zs`` (``TDMPC2Loss.policy_loss``)."""
        return self.loss_fn.policy_loss(self.model, zs)

    # ------------------------------------------------------------------ optimizers
    @property
    def _model_params(self) -> list[nn.Parameter]:
        return [p for group in model_param_groups(self.model) for p in group["params"]]

    def configure_optimizers(self) -> list[torch.optim.Optimizer]:
        hp = self.hparams
        groups = model_param_groups(self.model, hp.lr, hp.enc_lr_scale)
        return [
            self.make_optimizer(groups, hp.lr),
            self.make_optimizer(self._pi_param_groups(), hp.lr, eps=1e-5),
        ]

    def _pi_param_groups(self) -> list[dict]:
        """The policy prior's parameters and, when it is learned, the entropy coefficient (one Adam)."""
        groups = [{"params": list(self.model.pi_net.parameters())}]
        if self.hparams.target_entropy is not None:
            groups.append({"params": [self.loss_fn.log_entropy_coef]})
        return groups
