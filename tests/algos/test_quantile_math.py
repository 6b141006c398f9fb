"""The quantile and categorical math: distortions against hand-computed values, loss invariants."""

from __future__ import annotations

import pytest
import torch

from rl_lightning.algos.quantile.math import (
    RISKS,
    categorical_projection,
    check_risk,
    distort,
    midpoint_fractions,
    quantile_huber_loss,
)

TAU = torch.tensor([0.0, 0.2, 0.5, 0.8, 1.0], dtype=torch.float64)


# ---------------------------------------------------------------------------------------------- distortions
# Values worked out by hand from the formulas of IQN §3.1 (Φ read from a normal table).
@pytest.mark.parametrize(
    ("risk", "eta", "expected"),
    [
        ("neutral", 0.0, [0.0, 0.2, 0.5, 0.8, 1.0]),
        # CVaR(0.25): 0.25 * tau.
        ("cvar", 0.25, [0.0, 0.05, 0.125, 0.2, 0.25]),
        # Wang(-0.75): Φ(Φ⁻¹(tau) - 0.75); Φ⁻¹(0.2) = -0.8416 -> Φ(-1.5916) = 0.05574, Φ(-0.75) = 0.22663,
        # Φ⁻¹(0.8) = 0.8416 -> Φ(0.0916) = 0.53650.
        ("wang", -0.75, [0.0, 0.05574, 0.22663, 0.53650, 1.0]),
        # CPW(0.71): tau^.71 / (tau^.71 + (1 - tau)^.71)^(1/.71); at 0.5: 0.61135 / 1.22269^1.40845 = 0.46059;
        # at 0.2: 0.31894 / 1.17243^1.40845 = 0.25493; at 0.8: 0.85349 / 1.25113 = 0.68217.
        ("cpw", 0.71, [0.0, 0.25493, 0.46059, 0.68217, 1.0]),
        # Pow(-2): 1 - (1 - tau)^(1/3); at 0.5: 1 - 0.79370 = 0.20630; at 0.2: 1 - 0.92832 = 0.07168;
        # at 0.8: 1 - 0.58480 = 0.41520.
        ("pow", -2.0, [0.0, 0.07168, 0.20630, 0.41520, 1.0]),
        # Pow(2): tau^(1/3); 0.2^(1/3) = 0.58480, 0.5^(1/3) = 0.79370, 0.8^(1/3) = 0.92832.
        ("pow", 2.0, [0.0, 0.58480, 0.79370, 0.92832, 1.0]),
    ],
)
def test_distortions_match_hand_computed_values(risk: str, eta: float, expected: list[float]) -> None:
    torch.testing.assert_close(
        distort(TAU, risk, eta), torch.tensor(expected, dtype=torch.float64), atol=2e-5, rtol=0
    )


@pytest.mark.parametrize(("risk", "eta"), [("cvar", 0.1), ("wang", -0.75), ("cpw", 0.71), ("pow", -2.0)])
def test_averse_distortions_are_monotone_and_shift_weight_to_the_lower_tail(risk: str, eta: float) -> None:
    tau = torch.linspace(0, 1, 101, dtype=torch.float64)
    beta = distort(tau, risk, eta)
    assert (beta.diff() >= 0).all() and beta.min() >= 0 and beta.max() <= 1
    # The distorted mean of an increasing quantile function (here Z_tau = tau) falls below the neutral one.
    assert beta[1:-1].mean() < tau[1:-1].mean()


def test_risk_arguments_are_checked_with_what_to_do() -> None:
    assert set(RISKS) == {"neutral", "cvar", "wang", "cpw", "pow"}
    with pytest.raises(ValueError, match="one of"):
        check_risk("var", 0.1)
    with pytest.raises(ValueError, match="risk_param"):
        check_risk("cvar", 0.0)
    with pytest.raises(ValueError, match="risk_param"):
        check_risk("cpw", -1.0)
    check_risk("wang", -0.75)


def test_midpoint_fractions() -> None:
    torch.testing.assert_close(midpoint_fractions(4), torch.tensor([0.125, 0.375, 0.625, 0.875]))


# ---------------------------------------------------------------------------------------------- quantile loss
def test_quantile_loss_of_a_point_target_equal_to_the_prediction_is_zero() -> None:
    pred = torch.full((3, 5), 2.5, requires_grad=True)
    loss = quantile_huber_loss(pred, torch.full((3, 7), 2.5), midpoint_fractions(5))
    loss.sum().backward()
    assert torch.equal(loss, torch.zeros(3)) and torch.equal(pred.grad, torch.zeros(3, 5))


def test_quantile_loss_hand_computed() -> None:
    # One quantile at 0 with tau = 0.25 against targets {1, -1}, kappa = 1: both |delta| = 1, Huber 0.5;
    # weights |0.25 - 0| = 0.25 (target above) and |0.25 - 1| = 0.75 (below); mean over targets: 0.25.
    loss = quantile_huber_loss(torch.zeros(1, 1), torch.tensor([[1.0, -1.0]]), torch.tensor([0.25]))
    torch.testing.assert_close(loss, torch.tensor([0.25]))
    # Beyond kappa the Huber part is linear: delta = 3 -> 1 * (3 - 0.5) = 2.5, weight 0.25 -> 0.625.
    loss = quantile_huber_loss(torch.zeros(1, 1), torch.tensor([[3.0]]), torch.tensor([0.25]))
    torch.testing.assert_close(loss, torch.tensor([0.625]))
    # kappa scales: L_kappa / kappa with kappa = 2 and delta = 1: 0.5 / 2 * 0.25 = 0.0625.
    loss = quantile_huber_loss(torch.zeros(1, 1), torch.tensor([[1.0]]), torch.tensor([0.25]), kappa=2.0)
    torch.testing.assert_close(loss, torch.tensor([0.0625]))


def test_quantile_loss_gradient_signs_push_quantiles_towards_their_targets() -> None:
    tau = torch.tensor([0.1, 0.5, 0.9])
    target = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    below = torch.full((1, 3), -10.0, requires_grad=True)
    quantile_huber_loss(below, target, tau).sum().backward()
    # Far below every target: gradient -tau (descent raises the quantile, the higher tau the faster).
    torch.testing.assert_close(below.grad, -tau.unsqueeze(0))
    above = torch.full((1, 3), 10.0, requires_grad=True)
    quantile_huber_loss(above, target, tau).sum().backward()
    torch.testing.assert_close(above.grad, (1 - tau).unsqueeze(0))
    # No gradient reaches the targets.
    t = target.clone().requires_grad_(True)
    quantile_huber_loss(below.detach().requires_grad_(True), t, tau).sum().backward()
    assert t.grad is None


def test_quantile_regression_finds_the_quantiles_of_the_targets() -> None:
    torch.manual_seed(0)
    tau = midpoint_fractions(4)
    target = torch.arange(101.0).unsqueeze(0)  # uniform on 0..100: the tau-quantile is 100 tau
    theta = torch.zeros(1, 4, requires_grad=True)
    opt = torch.optim.Adam([theta], lr=1.0)
    for _ in range(400):
        opt.zero_grad()
        quantile_huber_loss(theta, target, tau).sum().backward()
        opt.step()
    torch.testing.assert_close(theta.detach(), 100 * tau.unsqueeze(0), atol=1.5, rtol=0)


# ------------------------------------------------------------------------------------------ C51 projection
SUPPORT = torch.tensor([0.0, 1.0, 2.0])


def test_projection_hand_computed() -> None:
    p = torch.tensor([[0.2, 0.3, 0.5]])
    # r = 0.5, discount 0.5: Tz = [0.5, 1.0, 1.5] -> atom 0 gets 0.2 / 2; atom 1 gets 0.2 / 2 + 0.3 + 0.5 / 2;
    # atom 2 gets 0.5 / 2.
    m = categorical_projection(p, torch.tensor([[0.5]]), torch.tensor([[0.5]]), SUPPORT)
    torch.testing.assert_close(m, torch.tensor([[0.1, 0.65, 0.25]]))
    # Terminal (discount 0): all mass at r = 1.25, split 0.75 / 0.25 between atoms 1 and 2.
    m = categorical_projection(p, torch.tensor([[1.25]]), torch.tensor([[0.0]]), SUPPORT)
    torch.testing.assert_close(m, torch.tensor([[0.0, 0.75, 0.25]]))
    # Returns beyond the support are clipped onto its ends.
    m = categorical_projection(p, torch.tensor([[10.0]]), torch.tensor([[0.9]]), SUPPORT)
    torch.testing.assert_close(m, torch.tensor([[0.0, 0.0, 1.0]]))
    # An atom landing exactly on a support atom keeps all its mass (the l == u case).
    m = categorical_projection(p, torch.tensor([[1.0]]), torch.tensor([[1.0]]), SUPPORT)
    torch.testing.assert_close(m, torch.tensor([[0.0, 0.2, 0.8]]))


def test_projection_conserves_probability_mass() -> None:
    g = torch.Generator().manual_seed(0)
    support = torch.linspace(-10, 10, 51)
    p = torch.softmax(torch.randn(256, 51, generator=g), -1)
    reward = 8 * torch.randn(256, 1, generator=g)  # many beyond the support
    discount = torch.where(torch.rand(256, 1, generator=g) < 0.2, 0.0, 0.99**3)
    m = categorical_projection(p, reward, discount, support)
    assert (m >= 0).all()
    torch.testing.assert_close(m.sum(-1), torch.ones(256))
    # The projection keeps the mean where no atom is clipped (r = 0, discount 1 is the identity).
    same = categorical_projection(p, torch.zeros(256, 1), torch.ones(256, 1), support)
    torch.testing.assert_close(same, p)


def test_cross_entropy_to_a_target_equal_to_the_prediction_has_zero_kl_and_gradient() -> None:
    logits = torch.randn(4, 51, requires_grad=True)
    m = torch.softmax(logits, -1).detach()
    log_p = torch.log_softmax(logits, -1)
    ce = -(m * log_p).sum(-1)
    kl = ce + (m * m.log()).sum(-1)
    ce.sum().backward()
    torch.testing.assert_close(kl, torch.zeros(4), atol=1e-6, rtol=0)
    torch.testing.assert_close(logits.grad, torch.zeros(4, 51), atol=1e-6, rtol=0)
