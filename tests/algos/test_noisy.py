"""Noisy layers: the caller switches the noise, each update draws new noise, evaluation runs without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.batches import EPS0, N_ACTIONS, OBS_DIM, quantile_module, transitions
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rl_lightning.nn.noisy import NoisyLinear, NoisyMLP, reset_noise


def test_noisy_linear_is_mean_plus_factorized_noise_switched_by_the_caller() -> None:
    torch.manual_seed(0)
    layer = NoisyLinear(5, 3, std_init=0.5)
    x = torch.randn(7, 5)
    mean = F.linear(x, layer.weight_mu, layer.bias_mu)
    noisy = F.linear(
        x,
        layer.weight_mu + layer.weight_sigma * layer.weight_epsilon,
        layer.bias_mu + layer.bias_sigma * layer.bias_epsilon,
    )
    # The noise follows the argument, not the exploration type nor train/eval mode.
    layer.eval()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        torch.testing.assert_close(layer(x), noisy)
    layer.train()
    with set_exploration_type(ExplorationType.RANDOM):
        torch.testing.assert_close(layer(x, noisy=False), mean)
    assert not torch.allclose(noisy, mean)
    # Factorized: the weight noise is the outer product f(eps_out) f(eps_in)^T, rank one.
    assert torch.linalg.matrix_rank(layer.weight_epsilon) == 1
    torch.testing.assert_close(
        layer.weight_epsilon[:, 0], layer.bias_epsilon * layer.weight_epsilon[0, 0] / layer.bias_epsilon[0]
    )
    # sigma_0 / sqrt(fan_in) for the weights, sigma_0 / sqrt(fan_out) for the bias.
    torch.testing.assert_close(layer.weight_sigma, torch.full((3, 5), 0.5 / 5**0.5))
    torch.testing.assert_close(layer.bias_sigma, torch.full((3,), 0.5 / 3**0.5))


def test_reset_noise_draws_new_noise_only_in_noisy_layers() -> None:
    torch.manual_seed(0)
    net = NoisyMLP(4, [8], 2, noisy=True)
    plain = NoisyMLP(4, [8], 2, noisy=False)
    eps = [layer.weight_epsilon.clone() for layer in net.layers]
    before = [p.clone() for p in plain.parameters()]
    reset_noise(net)
    reset_noise(plain)
    assert all(not torch.equal(a, layer.weight_epsilon) for a, layer in zip(eps, net.layers))
    assert all(torch.equal(a, b) for a, b in zip(before, plain.parameters()))
    x = torch.randn(3, 4)
    torch.testing.assert_close(plain(x, noisy=True), plain(x, noisy=False))


def noise(module: torch.nn.Module) -> list[torch.Tensor]:
    return [b.clone() for n, b in module.named_buffers() if n.endswith("epsilon")]


@pytest.mark.parametrize("name", ["rainbow", "qrdqn", "iqn"])
def test_noise_changes_between_updates_and_is_off_in_act_eval(name: str) -> None:
    m = quantile_module(name, **({} if name == "rainbow" else {"noisy": True, **EPS0}))
    assert noise(m.online)
    obs = torch.randn(256, OBS_DIM)
    td = TensorDict({"observation": obs}, [256])
    eval_before = m.act_eval(td.clone())["action"]
    n0 = noise(m.online)
    m.update(transitions(16, OBS_DIM, N_ACTIONS, 1, terminated=0.3))
    n1, t1 = noise(m.online), noise(m.target)
    m.update(transitions(16, OBS_DIM, N_ACTIONS, 2, terminated=0.3))
    n2 = noise(m.online)
    # New noise at every update, drawn independently for the target network.
    assert all(not torch.equal(a, b) for a, b in zip(n0, n1))
    assert all(not torch.equal(a, b) for a, b in zip(n1, n2))
    assert all(not torch.equal(a, b) for a, b in zip(n1, t1))
    # The sigma parameters learn.
    sigmas = [p for n, p in m.online.named_parameters() if "sigma" in n]
    assert sigmas and all(p.grad is not None and p.grad.abs().sum() > 0 for p in sigmas)
    # Evaluation uses the mean weights: the same actions whatever the noise, the greedy ones without it.
    eval_a = m.act_eval(td.clone())["action"]
    reset_noise(m.online)
    assert torch.equal(eval_a, m.act_eval(td.clone())["action"])
    torch.testing.assert_close(eval_a, m.q_values(obs, explore=False).argmax(-1))
    if name != "iqn":  # IQN's exploring estimate also samples fractions; the noise check is the same
        torch.testing.assert_close(m.act(td.clone())["action"], m.q_values(obs, explore=True).argmax(-1))
    # Exploration by noise alone (epsilon 0): the exploring actions differ from the greedy ones somewhere.
    assert (m.act(td.clone())["action"] != eval_a).any()
    assert eval_before.shape == eval_a.shape
