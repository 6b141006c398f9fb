"""Soft option-critic math: the termination gradient's sign, the continuation value at β = 0 and β = 1,
the critic targets, the policy over options, the tanh-Gaussian sample against TorchRL's, and option
selection that switches only at sampled terminations or where an option must start."""

from __future__ import annotations

import pytest
import torch
from torchrl.modules import TanhNormal

from rl_lightning.algos.options import math as om

K, N = 4, 4096


def test_continuation_is_the_option_value_when_beta_is_0_and_the_state_value_when_beta_is_1() -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(8, K, generator=g)
    v = om.option_state_value(q, om.option_policy_probs(q, "softmax", 1.0, 0.0))
    torch.testing.assert_close(om.continuation_value(q, v, torch.zeros_like(q)), q)
    torch.testing.assert_close(om.continuation_value(q, v, torch.ones_like(q)), v.unsqueeze(-1).expand_as(q))
    beta = torch.rand(8, K, generator=g)
    expected = (1 - beta) * q + beta * v.unsqueeze(-1)
    torch.testing.assert_close(om.continuation_value(q, v, beta), expected)
    # The gathered form (the option that acted) gives the same numbers.
    idx = torch.randint(0, K, (8, 1), generator=g)
    gathered = om.continuation_value(q.gather(-1, idx).squeeze(-1), v, beta.gather(-1, idx).squeeze(-1))
    torch.testing.assert_close(gathered, expected.gather(-1, idx).squeeze(-1))


def test_state_value_is_the_expectation_under_the_policy_over_options() -> None:
    q = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    probs = om.option_policy_probs(q, "softmax", 0.5, 0.0)
    torch.testing.assert_close(probs, torch.softmax(q / 0.5, -1))
    torch.testing.assert_close(om.option_state_value(q, probs), (probs * q).sum(-1))
    eps = om.option_policy_probs(q, "epsilon_greedy", 1.0, 0.2)
    torch.testing.assert_close(eps, torch.tensor([[0.05, 0.05, 0.05, 0.85]]))
    # One option: the policy over options is certain and V equals Q.
    one = torch.tensor([[-3.0]])
    assert om.option_state_value(one, om.option_policy_probs(one, "softmax", 1.0, 0.0)).item() == -3.0


def test_critic_targets_bootstrap_the_continuation_only_before_a_termination() -> None:
    reward = torch.tensor([[1.0], [2.0]])
    terminated = torch.tensor([[False], [True]])
    u = torch.tensor([[10.0, 20.0], [30.0, 40.0]])
    y = om.critic_targets(reward, terminated, 0.5, u)
    torch.testing.assert_close(y, torch.tensor([[6.0, 11.0], [2.0, 2.0]]))


@pytest.mark.parametrize("advantage, cost, sign", [(-1.0, 0.1, +1), (1.0, 0.1, -1), (-0.05, 0.1, -1)])
def test_termination_gradient_stops_options_worse_than_the_average_by_more_than_the_cost(
    advantage: float, cost: float, sign: int
) -> None:
    """``∂L/∂β = A + ξ``: a descent step raises β where ``A + ξ < 0`` and lowers it elsewhere."""
    logit = torch.zeros(3, requires_grad=True)
    beta = torch.sigmoid(logit)
    loss = om.termination_loss(beta, torch.full((3,), advantage), cost, torch.ones(3, dtype=torch.bool), None)
    loss.backward()
    # dβ/dlogit = β(1-β) = 1/4 at 0, mean over 3 rows.
    torch.testing.assert_close(logit.grad, torch.full((3,), (advantage + cost) / 4 / 3))
    with torch.no_grad():
        stepped = torch.sigmoid(logit - 0.1 * logit.grad)
    assert ((stepped - beta.detach()).sign() == sign).all()


def test_termination_loss_ignores_masked_rows_and_weights_the_rest() -> None:
    beta = torch.tensor([0.2, 0.4, 0.6], requires_grad=True)
    adv = torch.tensor([1.0, -2.0, 3.0])
    mask = torch.tensor([True, False, True])
    w = torch.tensor([1.0, 5.0, 3.0])
    loss = om.termination_loss(beta, adv, 0.0, mask, w)
    torch.testing.assert_close(loss, torch.tensor((0.2 * 1.0 * 1 + 0.6 * 3.0 * 3) / 4))
    loss.backward()
    assert beta.grad[1] == 0
    # The advantage is a constant: no gradient reaches it.
    assert not om.termination_loss(beta.detach(), adv.requires_grad_(True), 0.0, mask, None).requires_grad


def test_tanh_normal_sample_and_score_are_torchrls() -> None:
    g = torch.Generator().manual_seed(1)
    loc, scale = torch.randn(64, K, 3, generator=g) * 2, torch.rand(64, K, 3, generator=g) + 0.05
    torch.manual_seed(7)
    expected_a, expected_lp = TanhNormal(loc, scale).rsample_and_log_prob()
    torch.manual_seed(7)
    a, lp = om.tanh_normal_rsample(loc, scale)
    torch.testing.assert_close(a, expected_a)
    torch.testing.assert_close(lp, expected_lp)
    assert lp.shape == (64, K)


def test_categorical_option_values_are_exact_soft_expectations() -> None:
    g = torch.Generator().manual_seed(2)
    logits, q = torch.randn(5, K, 3, generator=g), torch.randn(5, K, 3, generator=g)
    alpha = torch.tensor(0.3)
    q_omega, e_log_pi, pi = om.categorical_option_values(logits, q, alpha)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(pi, p)
    torch.testing.assert_close(q_omega, (p * (q - alpha * p.log())).sum(-1))
    torch.testing.assert_close(e_log_pi, (p * p.log()).sum(-1))


# ------------------------------------------------------------------ selection
def select(prev, age, beta, q, deterministic=False, mode="softmax", temperature=1.0, epsilon=0.0):
    return om.select_options(prev, age, beta, q, mode, temperature, epsilon, deterministic)


def test_options_never_switch_without_a_termination() -> None:
    torch.manual_seed(0)
    prev = torch.randint(0, K, (N,))
    age = torch.randint(1, 50, (N,))
    q = torch.randn(N, K) * 10
    option, new_age, start = select(prev, age, torch.zeros(N), q)
    assert torch.equal(option, prev) and not start.any() and torch.equal(new_age, age + 1)


def test_options_start_where_none_is_active_and_follow_the_policy_over_options() -> None:
    torch.manual_seed(0)
    prev = torch.zeros(N, dtype=torch.int64)
    q = torch.tensor([0.0, 1.0, 2.0, 3.0]).expand(N, K)
    option, age, start = select(prev, torch.zeros(N, dtype=torch.int64), torch.zeros(N), q)
    assert start.all() and (age == 1).all()
    freq = torch.bincount(option, minlength=K).float() / N
    torch.testing.assert_close(freq, torch.softmax(q[0], -1), atol=0.03, rtol=0)


def test_terminations_are_drawn_with_probability_beta_and_only_they_switch() -> None:
    torch.manual_seed(0)
    prev = torch.randint(0, K, (N,))
    age = torch.full((N,), 5)
    beta = torch.rand(N)
    option, new_age, start = select(prev, age, beta, torch.zeros(N, K))
    # Switches happen only where a termination was drawn; a termination restarts the age.
    assert start[option != prev].all()
    assert torch.equal(new_age, torch.where(start, 1, 6))
    # Terminations come with probability beta: their count by beta quartile matches beta's mean there.
    for lo in (0.0, 0.25, 0.5, 0.75):
        band = (beta >= lo) & (beta < lo + 0.25)
        assert abs(start[band].float().mean().item() - beta[band].mean().item()) < 0.05
    # A uniform policy over options re-picks the same option in a quarter of the terminations.
    same = (option == prev)[start].float().mean().item()
    assert abs(same - 1 / K) < 0.05


def test_deterministic_selection_keeps_the_option_until_beta_exceeds_a_half_then_takes_the_best() -> None:
    prev = torch.tensor([0, 1, 2, 3])
    age = torch.tensor([3, 3, 0, 3])
    beta = torch.tensor([0.4, 0.6, 0.0, 0.5])
    q = torch.tensor([[0.0, 0.0, 5.0, 1.0]]).expand(4, K)
    option, new_age, start = select(prev, age, beta, q, deterministic=True)
    assert start.tolist() == [False, True, True, False]
    assert option.tolist() == [0, 2, 2, 3] and new_age.tolist() == [4, 1, 1, 4]


def test_epsilon_greedy_selection_takes_the_best_option_but_epsilon() -> None:
    torch.manual_seed(0)
    q = torch.tensor([0.0, 0.0, 1.0, 0.0]).expand(N, K)
    none = torch.zeros(N, dtype=torch.int64)
    option, _, _ = select(none, none, torch.zeros(N), q, mode="epsilon_greedy", epsilon=0.2)
    freq = torch.bincount(option, minlength=K).float() / N
    torch.testing.assert_close(freq, torch.tensor([0.05, 0.05, 0.85, 0.05]), atol=0.03, rtol=0)


def test_common_noise_gives_equal_options_equal_samples_and_keeps_each_options_distribution() -> None:
    g = torch.Generator().manual_seed(3)
    loc = torch.randn(2048, 1, 2, generator=g).expand(2048, K, 2)  # four equal options
    scale = torch.full_like(loc, 0.5)
    a, lp = om.tanh_normal_rsample(loc, scale, common_noise=True)
    assert torch.equal(a, a[:, :1].expand_as(a)) and torch.equal(lp, lp[:, :1].expand_as(lp))
    a_ind, _ = om.tanh_normal_rsample(loc, scale)
    assert not torch.equal(a_ind[:, 0], a_ind[:, 1])
    # Each option's marginal is unchanged: the same mean and spread as independent draws.
    torch.testing.assert_close(a.mean((0, 1)), a_ind.mean((0, 1)), atol=0.03, rtol=0)
    torch.testing.assert_close(a.std((0, 1)), a_ind.std((0, 1)), atol=0.03, rtol=0)
    # One option: the same draw as without sharing.
    one = loc[:, :1]
    torch.manual_seed(4)
    shared = om.tanh_normal_rsample(one, scale[:, :1], common_noise=True)
    torch.manual_seed(4)
    torch.testing.assert_close(shared, om.tanh_normal_rsample(one, scale[:, :1]))
