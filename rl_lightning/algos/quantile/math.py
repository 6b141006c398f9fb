r"""The quantile and categorical math of the distributional family, in one place.

Every function is device-side, has static shapes and never synchronizes the host, so the losses can sit
inside compiled and CUDA-graphed updates.

Notation: a batch of ``B`` transitions, ``A`` actions, ``N`` predicted quantile fractions :math:`\tau_i`,
``N'`` target fractions :math:`\tau'_j`, ``K`` atoms :math:`z_k` of a categorical support.

Quantile regression (QR-DQN, Dabney et al. 2017; IQN, Dabney et al. 2018). With the pairwise TD errors
:math:`\delta_{ij} = y_j - \theta_i` between target samples :math:`y_j` and predicted quantiles
:math:`\theta_i` at fractions :math:`\tau_i`, the quantile Huber loss is

.. math::

    \rho^\kappa_{\tau}(\delta) = |\tau - \mathbb{1}\{\delta < 0\}| \, \frac{L_\kappa(\delta)}{\kappa},
    \qquad L_\kappa(\delta) = \begin{cases} \tfrac12 \delta^2 & |\delta| \le \kappa \\
    \kappa (|\delta| - \tfrac12 \kappa) & \text{otherwise} \end{cases}

    \mathcal{L} = \sum_{i=1}^{N} \frac{1}{N'} \sum_{j=1}^{N'} \rho^\kappa_{\tau_i}(\delta_{ij}).

Its gradient in :math:`\theta_i` is :math:`-|\tau_i - \mathbb{1}\{\delta<0\}| L'_\kappa(\delta)/\kappa`:
a quantile below its targets is pushed up with weight :math:`\tau_i`, one above them down with weight
:math:`1 - \tau_i`, so :math:`\theta_i` settles at the :math:`\tau_i`-quantile of the targets.

Categorical projection (C51, Bellemare et al. 2017). On the support :math:`z_k = v_{min} + k \Delta z`,
the target atoms :math:`\hat{T} z_k = r + \gamma^n (1 - d) z_k` clipped to :math:`[v_{min}, v_{max}]` sit at
fractional indices :math:`b_k = (\hat{T} z_k - v_{min}) / \Delta z`; atom :math:`l` receives

.. math::

    m_l = \sum_k p_k \, \max(0, 1 - |b_k - l|),

the mass of each target atom split between its two neighbours in proportion to closeness. Since
:math:`\sum_l \max(0, 1 - |b - l|) = 1` for every :math:`b \in [0, K-1]`, the projection conserves mass
(and a target atom that falls exactly on a support atom stays whole, where the floor/ceil form of the
paper needs a special case).

Distortion risk measures (IQN §3.1): acting on :math:`\mathbb{E}_{\tau \sim U}[Z_{\beta(\tau)}]` for a
distortion :math:`\beta: [0, 1] \to [0, 1]` evaluates the distorted expectation of the return:

- neutral: :math:`\beta(\tau) = \tau`;
- CVaR(:math:`\eta`): :math:`\beta(\tau) = \eta \tau` (the mean of the worst :math:`\eta` fraction);
- Wang(:math:`\eta`): :math:`\beta(\tau) = \Phi(\Phi^{-1}(\tau) + \eta)` (:math:`\eta < 0` averse);
- CPW(:math:`\eta`): :math:`\beta(\tau) = \tau^\eta / (\tau^\eta + (1 - \tau)^\eta)^{1/\eta}`
  (Tversky & Kahneman's weighting, :math:`\eta = 0.71` in the paper);
- Pow(:math:`\eta`): :math:`\beta(\tau) = \tau^{1/(1+|\eta|)}` if :math:`\eta \ge 0`, else
  :math:`1 - (1 - \tau)^{1/(1+|\eta|)}` (:math:`\eta < 0` averse).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "RISKS",
    "categorical_projection",
    "check_risk",
    "distort",
    "midpoint_fractions",
    "pairwise_td",
    "quantile_huber_loss",
]

#: The distortion risk measures :func:`distort` knows, by config name.
RISKS = ("neutral", "cvar", "wang", "cpw", "pow")


def check_risk(risk: str, eta: float) -> None:
    """Raises ``ValueError`` with what to do when ``(risk, eta)`` is not a valid distortion."""
    if risk not in RISKS:
        raise ValueError(f"algo.risk={risk!r} is not a distortion; use one of {RISKS}.")
    if risk == "cvar" and not 0.0 < eta <= 1.0:
        raise ValueError(f"algo.risk=cvar needs 0 < algo.risk_param <= 1 (the tail fraction), got {eta}.")
    if risk == "cpw" and eta <= 0.0:
        raise ValueError(f"algo.risk=cpw needs algo.risk_param > 0 (0.71 in the IQN paper), got {eta}.")


def distort(tau: Tensor, risk: str, eta: float) -> Tensor:
    """Applies the distortion ``risk`` with parameter ``eta`` to fractions ``tau`` (any shape, in [0, 1]).

    See the module docstring for the formulas. ``risk`` and ``eta`` are config values (Python), so the
    choice of formula is made once at trace time, never on tensor values.

    Returns:
        :math:`\\beta(\\tau)`, the same shape as ``tau``, in [0, 1].
    """
    if risk == "neutral":
        return tau
    if risk == "cvar":
        return tau * eta
    if risk == "wang":
        # ndtri(0) = -inf and ndtr(-inf) = 0: the ends of [0, 1] map to themselves.
        return torch.special.ndtr(torch.special.ndtri(tau) + eta)
    if risk == "cpw":
        t = tau.pow(eta)
        return t / (t + (1.0 - tau).pow(eta)).pow(1.0 / eta)
    if risk == "pow":
        exponent = 1.0 / (1.0 + abs(eta))
        return tau.pow(exponent) if eta >= 0 else 1.0 - (1.0 - tau).pow(exponent)
    raise ValueError(f"unknown distortion {risk!r}; use one of {RISKS}.")


def midpoint_fractions(n: int, device: torch.device | str | None = None) -> Tensor:
    """The quantile midpoints :math:`\\hat\\tau_i = (2i - 1) / (2n)`, ``i = 1..n`` (QR-DQN), shape ``[n]``."""
    return (torch.arange(n, device=device, dtype=torch.float32) + 0.5) / n


def pairwise_td(target: Tensor, pred: Tensor) -> Tensor:
    """:math:`\\delta_{ij} = y_j - \\theta_i`: ``target [B, N']`` and ``pred [B, N]`` -> ``[B, N, N']``."""
    return target.unsqueeze(-2) - pred.unsqueeze(-1)


def quantile_huber_loss(pred: Tensor, target: Tensor, tau: Tensor, kappa: float = 1.0) -> Tensor:
    """The quantile Huber loss per sample.

    :math:`\\sum_i \\frac{1}{N'}\\sum_j \\rho^\\kappa_{\\tau_i}(\\delta_{ij})` (see the module docstring).

    Args:
        pred: predicted quantiles :math:`\\theta_i` of the taken action, ``[B, N]``.
        target: target samples :math:`y_j` (no gradient flows into them), ``[B, N']``.
        tau: the fractions of ``pred``, ``[B, N]`` or ``[N]``.
        kappa: Huber threshold :math:`\\kappa > 0` (1 in QR-DQN and IQN).

    Returns:
        ``[B]`` per-sample losses (the priorities of prioritized replay, as in Rainbow).
    """
    delta = pairwise_td(target.detach(), pred)
    abs_delta = delta.abs()
    huber = torch.where(abs_delta <= kappa, 0.5 * delta.pow(2), kappa * (abs_delta - 0.5 * kappa))
    weight = (tau.unsqueeze(-1) - (delta.detach() < 0).to(delta.dtype)).abs()
    return (weight * huber / kappa).mean(-1).sum(-1)


def categorical_projection(next_probs: Tensor, reward: Tensor, discount: Tensor, support: Tensor) -> Tensor:
    """Projects the target distribution :math:`\\hat{T}Z` onto the fixed support (C51's :math:`\\Phi`).

    Args:
        next_probs: probabilities :math:`p_k` of the next state's chosen action, ``[B, K]``.
        reward: ``[B, 1]`` (n-step) rewards.
        discount: ``[B, 1]``: :math:`\\gamma^n (1 - \\text{terminated})`.
        support: the atoms :math:`z_k`, ``[K]``, evenly spaced, increasing.

    Returns:
        ``[B, K]`` projected probabilities :math:`m_l`; each row sums to the row of ``next_probs``.
    """
    n_atoms = support.shape[-1]
    v_min, v_max = support[0], support[-1]
    delta_z = (v_max - v_min) / (n_atoms - 1)
    tz = (reward + discount * support).clamp(v_min, v_max)  # [B, K]
    b = (tz - v_min) / delta_z  # fractional index of each target atom
    atoms = torch.arange(n_atoms, device=support.device, dtype=b.dtype)
    # [B, K (target atom k), K (support atom l)]: the hat function max(0, 1 - |b_k - l|).
    share = (1.0 - (b.unsqueeze(-1) - atoms).abs()).clamp_min(0.0)
    return torch.einsum("bk,bkl->bl", next_probs, share)
