"""Numerical helpers of TD-MPC2: symlog transforms, two-hot discrete regression, the squashed-Gaussian
policy's log-probabilities, Gumbel sampling, the running Q scale and the discount heuristic.

All functions are elementwise or reduce over the last dimension only, accept any leading batch shape,
and contain no host synchronisation, so they can sit inside a compiled / CUDA-graphed update.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "RunningScale",
    "discount_from_episode_length",
    "gaussian_logprob",
    "gumbel_softmax_sample",
    "soft_ce",
    "squash",
    "squash_log_std",
    "symexp",
    "symlog",
    "tanh_gaussian_sample",
    "two_hot",
    "two_hot_inv",
]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def symlog(x: Tensor) -> Tensor:
    """``sign(x) * log(1 + |x|)``: compresses large magnitudes (DreamerV3), elementwise."""
    return torch.sign(x) * torch.log1p(torch.abs(x))


def symexp(x: Tensor) -> Tensor:
    """``sign(x) * (exp(|x|) - 1)``: the inverse of :func:`symlog`, elementwise."""
    return torch.sign(x) * torch.expm1(torch.abs(x))


def two_hot(x: Tensor, num_bins: int = 101, vmin: float = -10.0, vmax: float = 10.0) -> Tensor:
    """Encodes scalars as soft two-hot vectors over ``num_bins`` evenly spaced bins in symlog space.

    ``symlog(x)`` is clipped to ``[vmin, vmax]`` and its mass split between the two neighbouring bins
    in proportion to proximity, so ``two_hot_inv`` of the log of the result recovers the clipped value.

    Args:
        x: scalars, shape ``[..., 1]``.
        num_bins: number of bins (≥ 2).
        vmin: lowest bin centre (symlog space).
        vmax: highest bin centre (symlog space).

    Returns:
        Soft targets ``[..., num_bins]`` summing to 1.
    """
    bin_size = (vmax - vmin) / (num_bins - 1)
    pos = (symlog(x).clamp(vmin, vmax) - vmin) / bin_size
    # Clamping the lower index to num_bins - 2 puts x = vmax fully on the last bin without wrapping.
    low = pos.floor().clamp(0, num_bins - 2)
    upper_weight = pos - low
    out = torch.zeros(*x.shape[:-1], num_bins, device=x.device, dtype=x.dtype)
    low = low.long()
    out = out.scatter(-1, low, 1 - upper_weight)
    return out.scatter(-1, low + 1, upper_weight)


def two_hot_inv(logits: Tensor, num_bins: int = 101, vmin: float = -10.0, vmax: float = 10.0) -> Tensor:
    """Decodes bin logits to scalars: ``symexp(E_softmax[bin centre])``.

    Args:
        logits: unnormalised log-probabilities ``[..., num_bins]``.
        num_bins: number of bins.
        vmin: lowest bin centre (symlog space).
        vmax: highest bin centre (symlog space).

    Returns:
        Scalars ``[..., 1]``.
    """
    bins = torch.linspace(vmin, vmax, num_bins, device=logits.device, dtype=logits.dtype)
    probs = F.softmax(logits, dim=-1)
    return symexp((probs * bins).sum(-1, keepdim=True))


def soft_ce(
    logits: Tensor, target: Tensor, num_bins: int = 101, vmin: float = -10.0, vmax: float = 10.0
) -> Tensor:
    """Cross-entropy between bin logits and the two-hot encoding of scalar targets.

    Args:
        logits: ``[..., num_bins]``.
        target: scalars ``[..., 1]`` (broadcastable against ``logits[..., :1]``).
        num_bins: number of bins.
        vmin: lowest bin centre (symlog space).
        vmax: highest bin centre (symlog space).

    Returns:
        Per-element loss ``[..., 1]``.
    """
    log_probs = F.log_softmax(logits, dim=-1)
    return -(two_hot(target, num_bins, vmin, vmax) * log_probs).sum(-1, keepdim=True)


def squash_log_std(x: Tensor, low: float = -10.0, high: float = 2.0) -> Tensor:
    """Maps an unbounded network output smoothly into ``[low, high]``: ``low + (high-low)(tanh x + 1)/2``."""
    return low + 0.5 * (high - low) * (torch.tanh(x) + 1)


def gaussian_logprob(eps: Tensor, log_std: Tensor) -> Tensor:
    """Log-density of ``mean + eps * exp(log_std)`` under ``N(mean, exp(log_std)^2)``.

    Args:
        eps: standard-normal noise ``[..., A]``.
        log_std: ``[..., A]``.

    Returns:
        ``[..., 1]``, summed over the action dimension.
    """
    return (-0.5 * eps.pow(2) - log_std - _HALF_LOG_2PI).sum(-1, keepdim=True)


def squash(mean: Tensor, action: Tensor, log_prob: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Applies ``tanh`` to a Gaussian sample and corrects its log-probability by the Jacobian.

    Args:
        mean: pre-squash mean ``[..., A]``.
        action: pre-squash sample ``[..., A]``.
        log_prob: Gaussian log-probability of ``action`` ``[..., 1]``.

    Returns:
        ``(tanh(mean), tanh(action), log_prob - sum log(1 - tanh(action)^2))``; the ``1e-6`` and ReLU
        keep the correction finite when the sample saturates.
    """
    mean, action = torch.tanh(mean), torch.tanh(action)
    log_det = torch.log(F.relu(1 - action.pow(2)) + 1e-6).sum(-1, keepdim=True)
    return mean, action, log_prob - log_det


def tanh_gaussian_sample(mean: Tensor, log_std: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Reparameterised sample of a tanh-squashed Gaussian.

    Args:
        mean: pre-squash mean ``[..., A]``.
        log_std: ``[..., A]``.

    Returns:
        ``(action, squashed_mean, log_prob)`` with shapes ``[..., A]``, ``[..., A]``, ``[..., 1]``;
        ``-log_prob`` is a one-sample estimate of the policy's entropy.
    """
    eps = torch.randn_like(mean)
    log_prob = gaussian_logprob(eps, log_std)
    squashed_mean, action, log_prob = squash(mean, mean + eps * log_std.exp(), log_prob)
    return action, squashed_mean, log_prob


def gumbel_softmax_sample(probs: Tensor, temperature: float = 1.0, dim: int = -1) -> Tensor:
    """Draws one categorical index per row with the Gumbel-max trick.

    Unlike ``torch.multinomial`` it needs no host synchronisation and keeps a static shape, so it is safe
    inside CUDA graphs (the reason the reference planner uses it). The temperature scales the perturbed
    logits before the arg-max and so does not change the sampled distribution; it is kept for parity.

    Args:
        probs: non-negative weights along ``dim`` (need not be normalised).
        temperature: positive temperature.
        dim: the categorical dimension.

    Returns:
        Long indices with ``dim`` removed.
    """
    uniform = torch.rand_like(probs).clamp_(torch.finfo(probs.dtype).tiny, 1.0)
    gumbels = -torch.log(-torch.log(uniform))
    return ((probs.log() + gumbels) / temperature).argmax(dim)


def discount_from_episode_length(
    episode_length: int, denom: float = 5.0, min_discount: float = 0.95, max_discount: float = 0.995
) -> float:
    """TD-MPC2's discount heuristic: ``clip((L/denom - 1) / (L/denom), min, max)``.

    Longer episodes get a longer effective horizon; e.g. 1000 steps → 0.995 (capped), 250 → 0.98.

    Args:
        episode_length: (maximum) episode length in environment steps.
        denom: the reference's ``discount_denom``.
        min_discount: lower clip.
        max_discount: upper clip.

    Returns:
        The discount factor.
    """
    frac = episode_length / denom
    return min(max((frac - 1) / frac, min_discount), max_discount)


class RunningScale(nn.Module):
    """Running, outlier-trimmed scale of Q-values: an EMA of the 5th-95th percentile range (min 1).

    The policy loss divides Q by this scale so that the entropy coefficient means the same thing in
    every task whatever the reward magnitude. State lives in buffers (saved, moved with the module and
    updated in place, so a CUDA graph can replay the update).

    Args:
        tau: EMA rate of the update ``value ← lerp(value, new, tau)``.
        percentiles: lower and upper percentile.
    """

    value: Tensor

    def __init__(self, tau: float = 0.01, percentiles: tuple[float, float] = (5.0, 95.0)) -> None:
        super().__init__()
        self.tau = tau
        self.percentiles = percentiles
        self.register_buffer("value", torch.ones(1))

    def _percentile(self, x: Tensor, q: float) -> Tensor:
        # Positions come from the static shape, so unlike torch.quantile(tensor q) nothing syncs.
        n = x.shape[0]
        pos = q * (n - 1) / 100.0
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        w = pos - lo
        return x[lo] * (1 - w) + x[hi] * w

    def update(self, x: Tensor) -> None:
        """Moves the scale towards the percentile range of a batch.

        Args:
            x: values ``[B, ...]``; percentiles are taken over the flattened batch.
        """
        x = torch.sort(x.detach().reshape(-1).to(self.value.dtype)).values
        low, high = (self._percentile(x, q) for q in self.percentiles)
        self.value.lerp_((high - low).clamp(min=1.0).reshape(1), self.tau)

    def forward(self, x: Tensor, update: bool = False) -> Tensor:
        """Returns ``x / value`` (after an optional :meth:`update` with ``x``)."""
        if update:
            self.update(x)
        return x / self.value

    def extra_repr(self) -> str:
        return f"tau={self.tau}, percentiles={self.percentiles}"
