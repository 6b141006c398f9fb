"""TD-MPC2's implicit (decoder-free) world model: encoder, latent dynamics, reward, policy prior,
Q-ensemble with a Polyak target, and an optional termination head.
"""

from __future__ import annotations

import copy
from typing import Literal, NamedTuple

import torch
from torch import Tensor, nn

from rl_lightning.algos.common import polyak_update
from rl_lightning.algos.tdmpc2 import math as tdm
from rl_lightning.nn import Ensemble, SimNorm, mlp

__all__ = ["MODEL_SIZES", "PolicyOutput", "WorldModel", "model_size_preset"]

# Architecture presets of the reference implementation, keyed by approximate size in millions of
# parameters (counted for a typical DMControl task; obs/action sizes shift the count slightly).
MODEL_SIZES: dict[int, dict[str, int]] = {
    1: {"enc_dim": 256, "mlp_dim": 384, "latent_dim": 128, "num_enc_layers": 2, "num_q": 2},
    5: {"enc_dim": 256, "mlp_dim": 512, "latent_dim": 512, "num_enc_layers": 2, "num_q": 5},
    19: {"enc_dim": 1024, "mlp_dim": 1024, "latent_dim": 768, "num_enc_layers": 3, "num_q": 5},
    48: {"enc_dim": 1792, "mlp_dim": 1792, "latent_dim": 768, "num_enc_layers": 4, "num_q": 5},
    317: {"enc_dim": 4096, "mlp_dim": 4096, "latent_dim": 1376, "num_enc_layers": 5, "num_q": 8},
}


def model_size_preset(size: int) -> dict[str, int]:
    """Returns the architecture keyword arguments of a reference size preset (1, 5, 19, 48 or 317)."""
    if size not in MODEL_SIZES:
        raise ValueError(f"Unknown TD-MPC2 model size {size}; choose one of {sorted(MODEL_SIZES)}.")
    return dict(MODEL_SIZES[size])


class PolicyOutput(NamedTuple):
    """Output of :meth:`WorldModel.pi`; all fields share the leading batch shape ``[...]``.

    Attributes:
        action: reparameterised sample in ``[-1, 1]``, ``[..., A]``.
        mean: squashed mean ``tanh(mu)``, ``[..., A]``.
        log_std: pre-squash log standard deviation, in ``[log_std_min, log_std_max]``, ``[..., A]``.
        log_prob: log-probability of ``action`` under the tanh-Gaussian, ``[..., 1]``.
    """

    action: Tensor
    mean: Tensor
    log_std: Tensor
    log_prob: Tensor

    @property
    def entropy(self) -> Tensor:
        """One-sample entropy estimate ``-log_prob``, ``[..., 1]``."""
        return -self.log_prob


def _weight_init(m: nn.Module) -> None:
    # The reference's initialisation: small truncated normal weights, zero biases.
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


class WorldModel(nn.Module):
    """TD-MPC2 world model for vector observations (single task).

    Components (``z`` is the SimNorm latent, ``a`` the action in ``[-1, 1]``):

    - ``encoder``: obs → z, MLP with ``num_enc_layers - 1`` hidden layers of ``enc_dim``, SimNorm output;
    - ``dynamics``: [z, a] → z', two hidden layers of ``mlp_dim``, LayerNorm + SimNorm output;
    - ``reward_net``: [z, a] → ``num_bins`` logits (two-hot in symlog space), last layer zero-initialised;
    - ``pi_net``: z → mean and log-std of a tanh-Gaussian policy prior;
    - ``q_nets``: ``num_q`` Q-heads [z, a] → ``num_bins`` logits as one vmapped :class:`Ensemble`, dropout
      in the first layer, last layers zero-initialised (every head predicts 0 at initialisation);
    - ``target_q_nets``: a copy of ``q_nets`` without gradients, moved only by :meth:`soft_update_target_Q`;
    - ``termination_net`` (``episodic=True`` only): z' → termination logit.

    Dropout follows ``self.training``; the target ensemble always stays in eval mode. The reference
    computes TD targets and plans in eval mode and computes the losses in train mode.

    Args:
        obs_dim: observation size.
        action_dim: action size.
        latent_dim: latent size (a multiple of ``simnorm_dim``).
        enc_dim: encoder hidden width.
        mlp_dim: hidden width of dynamics, reward, policy, Q and termination networks.
        num_enc_layers: encoder depth (linear layers); the reference uses 2.
        num_q: Q-ensemble size (≥ 2).
        num_bins: bins of the reward/Q discrete regression.
        vmin: lowest bin (symlog space).
        vmax: highest bin (symlog space).
        dropout: dropout of the Q-heads' first layer.
        simnorm_dim: SimNorm group size.
        log_std_min: lower bound of the policy's log-std.
        log_std_max: upper bound of the policy's log-std.
        episodic: add the termination head (for tasks whose episodes end before the time limit).
        tau: Polyak rate of the target Q-ensemble.
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        latent_dim: int = 512,
        enc_dim: int = 256,
        mlp_dim: int = 512,
        num_enc_layers: int = 2,
        num_q: int = 5,
        num_bins: int = 101,
        vmin: float = -10.0,
        vmax: float = 10.0,
        dropout: float = 0.01,
        simnorm_dim: int = 8,
        log_std_min: float = -10.0,
        log_std_max: float = 2.0,
        episodic: bool = False,
        tau: float = 0.01,
    ) -> None:
        super().__init__()
        if latent_dim % simnorm_dim:
            raise ValueError(f"latent_dim={latent_dim} must be a multiple of simnorm_dim={simnorm_dim}.")
        if num_q < 2:
            raise ValueError(f"num_q={num_q}: TD-MPC2 needs at least 2 Q-heads (it subsamples two).")
        if num_bins < 2:
            raise ValueError(f"num_bins={num_bins}: the two-hot regression needs at least 2 bins.")
        self.obs_dim, self.action_dim, self.latent_dim = obs_dim, action_dim, latent_dim
        self.num_q, self.num_bins, self.vmin, self.vmax = num_q, num_bins, vmin, vmax
        self.log_std_min, self.log_std_max = log_std_min, log_std_max
        self.episodic, self.tau = episodic, tau

        za = latent_dim + action_dim
        self.encoder = mlp(
            obs_dim, max(num_enc_layers - 1, 1) * [enc_dim], latent_dim, act=SimNorm(simnorm_dim)
        )
        self.dynamics = mlp(za, 2 * [mlp_dim], latent_dim, act=SimNorm(simnorm_dim))
        self.reward_net = mlp(za, 2 * [mlp_dim], num_bins)
        self.pi_net = mlp(latent_dim, 2 * [mlp_dim], 2 * action_dim)
        self.termination_net = mlp(latent_dim, 2 * [mlp_dim], 1) if episodic else None
        heads = [mlp(za, 2 * [mlp_dim], num_bins, dropout=dropout) for _ in range(num_q)]
        for head in heads:
            head.apply(_weight_init)
        self.apply(_weight_init)
        self.q_nets = Ensemble(heads)
        with torch.no_grad():
            # Zero last layers: uniform bin logits decode to exactly 0 reward / value at initialisation.
            self.reward_net[-1].weight.zero_()
            self.q_nets.stacked(f"{len(heads[0]) - 1}.weight").zero_()
        self.target_q_nets = copy.deepcopy(self.q_nets).requires_grad_(False).train(False)

    @classmethod
    def from_preset(
        cls, size: int, obs_dim: int, action_dim: int, **kwargs: float | int | bool
    ) -> WorldModel:
        """Builds a model from a reference size preset (see :data:`MODEL_SIZES`); ``kwargs`` override it."""
        return cls(obs_dim, action_dim, **{**model_size_preset(size), **kwargs})

    def num_params(self, include_target: bool = False) -> int:
        """Number of parameters; the target ensemble is excluded unless asked for."""
        n = sum(p.numel() for p in self.parameters())
        return n if include_target else n - sum(p.numel() for p in self.target_q_nets.parameters())

    def train(self, mode: bool = True) -> WorldModel:
        super().train(mode)
        self.target_q_nets.train(False)  # TD targets never use dropout
        return self

    def two_hot_inv(self, logits: Tensor) -> Tensor:
        """Decodes ``[..., num_bins]`` logits of the reward or Q-heads to scalars ``[..., 1]``."""
        return tdm.two_hot_inv(logits, self.num_bins, self.vmin, self.vmax)

    def encode(self, obs: Tensor) -> Tensor:
        """Encodes observations ``[..., obs_dim]`` into latents ``[..., latent_dim]``."""
        return self.encoder(obs)

    def next(self, z: Tensor, a: Tensor) -> Tensor:
        """Predicts the next latent ``[..., latent_dim]`` from ``z [..., latent_dim]`` and ``a [..., A]``."""
        return self.dynamics(torch.cat([z, a], dim=-1))

    def reward(self, z: Tensor, a: Tensor) -> Tensor:
        """Reward logits ``[..., num_bins]`` of taking ``a`` in ``z``."""
        return self.reward_net(torch.cat([z, a], dim=-1))

    def predict_reward(self, z: Tensor, a: Tensor) -> Tensor:
        """Decoded reward ``[..., 1]``."""
        return self.two_hot_inv(self.reward(z, a))

    def termination_logits(self, z: Tensor) -> Tensor:
        """Termination logit ``[..., 1]`` of arriving in latent ``z`` (requires ``episodic=True``)."""
        if self.termination_net is None:
            raise RuntimeError("This WorldModel has no termination head; build it with episodic=True.")
        return self.termination_net(z)

    def termination(self, z: Tensor) -> Tensor:
        """Termination probability ``[..., 1]`` of arriving in latent ``z`` (requires ``episodic=True``)."""
        return torch.sigmoid(self.termination_logits(z))

    def pi(self, z: Tensor) -> PolicyOutput:
        """Samples the tanh-Gaussian policy prior.

        Args:
            z: latents ``[..., latent_dim]``.

        Returns:
            :class:`PolicyOutput` (sample, squashed mean, log-std, log-prob).
        """
        mu, raw_log_std = self.pi_net(z).chunk(2, dim=-1)
        log_std = tdm.squash_log_std(raw_log_std, self.log_std_min, self.log_std_max)
        action, mean, log_prob = tdm.tanh_gaussian_sample(mu, log_std)
        return PolicyOutput(action, mean, log_std, log_prob)

    def Q(
        self,
        z: Tensor,
        a: Tensor,
        return_type: Literal["min", "avg", "all"] = "min",
        target: bool = False,
        detach: bool = False,
    ) -> Tensor:
        """State-action values.

        ``min`` and ``avg`` draw two distinct heads at random (one draw for the whole batch, as in the
        reference) and return the minimum or the mean of their decoded values.

        Args:
            z: latents ``[..., latent_dim]``.
            a: actions ``[..., A]``.
            return_type: ``"min"``, ``"avg"`` (decoded ``[..., 1]``) or ``"all"`` (logits
                ``[num_q, ..., num_bins]``).
            target: use the target ensemble.
            detach: use the online ensemble with detached parameters (gradients reach ``z``/``a`` only).

        Returns:
            See ``return_type``.
        """
        za = torch.cat([z, a], dim=-1)
        logits = self.target_q_nets(za) if target else self.q_nets(za, detach=detach)
        if return_type == "all":
            return logits
        # argsort of uniform noise rather than randperm: inductor cannot compile a slice of randperm.
        idx = torch.rand(self.num_q, device=logits.device).argsort()[:2]
        q = self.two_hot_inv(logits[idx])
        if return_type == "min":
            return q.min(0).values
        if return_type == "avg":
            return q.mean(0)
        raise ValueError(f"return_type must be 'min', 'avg' or 'all', got {return_type!r}.")

    def soft_update_target_Q(self, tau: float | None = None) -> None:
        """Polyak update ``target ← target + tau (online - target)`` with one fused ``lerp_``."""
        polyak_update(
            self.target_q_nets.parameters(), self.q_nets.parameters(), self.tau if tau is None else tau
        )
