r"""The math of soft option-critic: option values, continuation, critic targets, terminations, selection.

Setting (call-and-return options, Sutton, Precup & Singh 1999; option-critic, Bacon et al. 2017). ``K``
options; option ``ω`` has an intra-option policy ``π(a|s,ω)`` and a termination probability ``β(s,ω)``; a
policy over options ``π_Ω(ω|s)`` picks an option whenever the active one terminates or an episode starts.
The agent in state ``s`` with option ``ω`` active acts with ``a ~ π(·|s,ω)``, reaches ``s'``, and there
``ω`` terminates with probability ``β(s',ω)``; if it does, ``π_Ω(·|s')`` picks the next option.

Values (soft in the intra-option policy, as in SAC, with temperature ``α``):

.. math::

    Q_U(s,ω,a) &= r(s,a) + γ\,\mathbb{E}_{s'}\big[U(s',ω)\big] \\
    Q_Ω(s,ω)   &= \mathbb{E}_{a\sim π(·|s,ω)}\big[Q_U(s,ω,a) - α \log π(a|s,ω)\big] \\
    V_Ω(s)     &= \textstyle\sum_ω π_Ω(ω|s)\, Q_Ω(s,ω) \\
    U(s',ω)    &= \big(1-β(s',ω)\big)\, Q_Ω(s',ω) + β(s',ω)\, V_Ω(s')

``U`` is the value of *arriving* in ``s'`` with ``ω`` active: with probability ``1 - β`` the option goes
on (worth ``Q_Ω(s',ω)``), with probability ``β`` it stops and the policy over options chooses afresh
(worth ``V_Ω(s')``, the expectation under ``π_Ω``). ``V_Ω`` is that plain expectation and carries no
entropy bonus of ``π_Ω``: the softmax over options is an exploration scheme (a Boltzmann policy over
``Q_Ω`` with its own temperature), not part of the objective. With an entropy bonus at every choice a
termination would always pay and the termination gradient would push every ``β`` towards 1.

**Critic target.** ``Q_U`` satisfies a Bellman equation whose only option-dependent term is ``U``; the
transition ``(s, a, r, s')`` does not depend on the option, so one stored transition gives a target for
*every* option's critic head (intra-option learning, Sutton et al. 1999):

.. math::

    y(ω) = r + γ\,(1 - d)\, U_{\bar θ}(s', ω) \qquad \text{for all } ω,

with ``d`` the termination flag of the env, ``Q_Ω(s',ω)`` estimated from one sample
``a'_ω ~ π(·|s',ω)`` per option and the minimum over the target critics (clipped double-Q):
``Q_Ω(s',ω) ≈ \min_i Q_{\bar θ_i}(s',ω,a'_ω) - α \log π(a'_ω|s',ω)``, the ``K`` samples drawn with one
shared noise (common random numbers, see :func:`tanh_normal_rsample`).

**Intra-option policies.** Soft policy improvement per option, on every sampled state and for every
option (all ``K`` heads in one call): minimise ``E[α log π(a|s,ω) - min_i Q_i(s,ω,a)]`` with the
reparameterised ``a``. The on-policy theorem weights states by the option's occupancy; like every
off-policy actor-critic, this drops the state weighting.

**Terminations.** By the termination gradient theorem (Bacon et al. 2017, Thm. 2) the gradient of the
option value with respect to the termination parameters ``ϑ`` is
``-E_{(s',ω)}[∂β(s',ω)/∂ϑ · A_Ω(s',ω)]`` with ``A_Ω(s',ω) = Q_Ω(s',ω) - V_Ω(s')``, the expectation over
the states where ``ω`` is active on arrival. A deliberation cost ``ξ`` charged at every termination
(Harb et al. 2018) turns ``U`` into ``(1-β)Q_Ω + β(V_Ω - ξ)`` and the gradient into
``-∂β/∂ϑ · (A_Ω + ξ)``. Gradient descent on

.. math::

    L_β = \mathbb{E}\big[β(s',ω) \cdot \mathrm{sg}\big(Q_Ω(s',ω) - V_Ω(s') + ξ\big)\big]

follows it: an option worse than the average by more than ``ξ`` learns to stop, the others to go on.
The expectation runs over replayed ``(s', ω)`` with ``ω`` the option that acted, the next state ``s'``,
and non-terminal transitions only.

**Reduction to SAC.** With ``K = 1``: ``π_Ω ≡ 1``, ``V_Ω = Q_Ω``, so ``U = Q_Ω`` whatever ``β`` and the
target is SAC's ``r + γ(1-d)(min_i Q_{\bar θ_i}(s',a') - α log π(a'|s'))``; the actor and temperature
losses are SAC's too.

**Selection.** At each step, per env: ``ω`` terminates with probability ``β(s, ω_prev)`` (or must be
chosen because an episode starts); a terminated one is replaced by a draw from ``π_Ω(·|s)``
(``softmax(Q_Ω/τ_Ω)``, or ε-greedy); a continuing one stays. One batched ``torch.where``, no loop.
Evaluation is greedy: terminate when ``β > 1/2``, pick ``argmax_ω Q_Ω``, act with the mean action.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rl_lightning.nn.actor_critic import tanh_normal_rsample

__all__ = [
    "OPTION_POLICIES",
    "categorical_option_values",
    "continuation_value",
    "critic_targets",
    "option_policy_probs",
    "option_state_value",
    "select_options",
    "tanh_normal_rsample",
    "termination_loss",
]

#: The policies over options: Boltzmann over ``Q_Ω`` with a temperature, or ε-greedy.
OPTION_POLICIES = ("softmax", "epsilon_greedy")


def categorical_option_values(logits: Tensor, q: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Exact soft values of categorical intra-option policies (discrete actions).

    Args:
        logits: ``[..., K, n]`` action logits of every option.
        q: ``[..., K, n]`` action values (already the minimum over the critics).
        alpha: the entropy temperature (scalar tensor).

    Returns:
        ``Q_Ω = Σ_a π (q - α log π)`` ``[..., K]``, ``E_π[log π]`` ``[..., K]`` and ``π`` ``[..., K, n]``.
    """
    log_pi = torch.log_softmax(logits, dim=-1)
    pi = log_pi.exp()
    return (pi * (q - alpha * log_pi)).sum(-1), (pi * log_pi).sum(-1), pi


def option_policy_probs(q_omega: Tensor, mode: str, temperature: float, epsilon: float) -> Tensor:
    """``π_Ω(ω|s)``: the policy over options.

    Args:
        q_omega: ``[..., K]`` option values ``Q_Ω(s, ·)``.
        mode: ``"softmax"`` (``softmax(Q_Ω / temperature)``) or ``"epsilon_greedy"`` (``1 - ε`` on the
            arg-max, ``ε`` spread over all ``K``).
        temperature: the softmax temperature ``τ_Ω`` (> 0).
        epsilon: the ε of ε-greedy.

    Returns:
        ``[..., K]`` probabilities.
    """
    if mode == "softmax":
        return torch.softmax(q_omega / temperature, dim=-1)
    k = q_omega.shape[-1]
    greedy = F.one_hot(q_omega.argmax(-1), k).to(q_omega.dtype)
    return (1.0 - epsilon) * greedy + epsilon / k


def option_state_value(q_omega: Tensor, probs: Tensor) -> Tensor:
    """``V_Ω(s) = Σ_ω π_Ω(ω|s) Q_Ω(s, ω)``: ``[..., K]`` -> ``[...]``."""
    return (probs * q_omega).sum(-1)


def continuation_value(q_omega: Tensor, v_omega: Tensor, beta: Tensor) -> Tensor:
    """``U(s', ω) = (1 - β(s', ω)) Q_Ω(s', ω) + β(s', ω) V_Ω(s')``.

    Args:
        q_omega: ``[..., K]`` (or gathered ``[...]``) option values at ``s'``.
        v_omega: ``[...]`` the value of choosing afresh at ``s'``.
        beta: termination probabilities, the shape of ``q_omega``.

    Returns:
        ``U``, the shape of ``q_omega``: ``Q_Ω`` where ``β = 0``, ``V_Ω`` where ``β = 1``.
    """
    if beta.dim() > v_omega.dim():
        v_omega = v_omega.unsqueeze(-1)
    return (1.0 - beta) * q_omega + beta * v_omega


def critic_targets(reward: Tensor, terminated: Tensor, gamma: float, u: Tensor) -> Tensor:
    """``y(ω) = r + γ (1 - d) U(s', ω)`` for every option (TorchRL's TD(0) form).

    Args:
        reward: ``[B, 1]`` rewards.
        terminated: ``[B, 1]`` bool, the env's termination (not truncation) flags.
        gamma: discount.
        u: ``[B, K]`` continuation values.

    Returns:
        ``[B, K]`` targets.
    """
    not_terminated = (~terminated).int()
    return reward + gamma * not_terminated * u


def termination_loss(
    beta: Tensor, advantage: Tensor, deliberation_cost: float, mask: Tensor, weights: Tensor | None
) -> Tensor:
    """``L_β = mean(β(s', ω) · sg(A_Ω(s', ω) + ξ))`` over the rows where ``mask`` holds.

    Its gradient is the option-critic termination gradient ``∂β/∂ϑ · (A_Ω + ξ)``: descending it raises
    ``β`` where the option is worse than the policy over options by more than ``ξ``.

    Args:
        beta: ``[B]`` termination probabilities of the option that acted, at the next state (with grad).
        advantage: ``[B]`` ``Q_Ω(s', ω) - V_Ω(s')`` (detached here).
        deliberation_cost: ``ξ``.
        mask: ``[B]`` bool, rows that count (non-terminal transitions taken by an option).
        weights: ``[B]`` importance weights of a prioritized sample, or ``None``.

    Returns:
        The scalar loss.
    """
    w = mask.to(beta.dtype)
    if weights is not None:
        w = w * weights.reshape(w.shape)
    per_row = beta * (advantage.detach() + deliberation_cost)
    return (per_row * w).sum() / w.sum().clamp_min(1e-8)


def select_options(
    prev_option: Tensor,
    age: Tensor,
    beta_prev: Tensor,
    q_omega: Tensor,
    mode: str,
    temperature: float,
    epsilon: float,
    deterministic: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Termination sampling and option choice for ``N`` envs at once (call-and-return).

    An env needs a new option where its previous one terminates (``u < β(s, ω_prev)``, or ``β > 1/2``
    when ``deterministic``) or where it has none (``age == 0``: an episode start, or the first step).
    A new option is drawn from ``π_Ω(·|s)`` (Gumbel-max over ``log π_Ω``, or arg-max of ``Q_Ω`` when
    ``deterministic``); every other env keeps its option.

    Args:
        prev_option: ``[N]`` int64, the active options.
        age: ``[N]`` int64, steps the active option has acted (0: none active).
        beta_prev: ``[N]`` ``β(s, ω_prev)``.
        q_omega: ``[N, K]`` ``Q_Ω(s, ·)``.
        mode, temperature, epsilon: the policy over options (:func:`option_policy_probs`).
        deterministic: evaluation's greedy rule.

    Returns:
        ``option [N]`` (int64), ``age [N]`` (1 where an option starts) and ``start [N]`` (bool).
    """
    if deterministic:
        start = (age == 0) | (beta_prev > 0.5)
        chosen = q_omega.argmax(-1)
    else:
        start = (age == 0) | (torch.rand_like(beta_prev) < beta_prev)
        log_p = option_policy_probs(q_omega, mode, temperature, epsilon).clamp_min(1e-30).log()
        gumbel = -torch.log(-torch.log(torch.rand_like(log_p).clamp_min(1e-20)))
        chosen = (log_p + gumbel).argmax(-1)
    option = torch.where(start, chosen, prev_option)
    age = torch.where(start, torch.ones_like(age), age + 1)
    return option, age, start
