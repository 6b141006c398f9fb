"""The parts every algorithm shares: action scaling, Polyak targets, schedules, per-env state."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import Bounded, Categorical

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.algos.common import (
    ActionScaler,
    LinearSchedule,
    PerEnvState,
    clip_grad_norm,
    episode_start,
    polyak_update,
    weighted_mean,
    without_grad,
)
from rl_lightning.nn.actor_critic import mlp_head, safe_tanh
from rl_lightning.nn.layers import EnsembleLinear, ensemble_mlp


def test_action_scaler_maps_the_unit_box_onto_the_bounds_and_back() -> None:
    spec = Bounded(
        low=torch.tensor([-2.0, 0.0]).expand(3, 2), high=torch.tensor([2.0, 1.0]).expand(3, 2), shape=(3, 2)
    )
    scaler = ActionScaler(spec, "ALGO")
    unit = torch.tensor([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0]])
    env = scaler.to_env(unit)
    torch.testing.assert_close(env, torch.tensor([[-2.0, 0.0], [0.0, 0.5], [2.0, 1.0]]))
    torch.testing.assert_close(scaler.from_env(env), unit)
    assert scaler.from_env(torch.tensor([[5.0, -3.0]])).tolist() == [[1.0, -1.0]]  # clamped
    assert scaler.action_dim == 2


def test_action_scaler_refuses_discrete_and_unbounded_actions() -> None:
    with pytest.raises(IncompatibleEnvError, match="bounded continuous"):
        ActionScaler(Categorical(4, shape=(1,)), "ALGO")
    with pytest.raises(IncompatibleEnvError, match="finite"):
        ActionScaler(Bounded(low=-float("inf"), high=1.0, shape=(1, 1)), "ALGO")


@pytest.mark.parametrize("tau", [0.25, torch.tensor(0.25)])
def test_polyak_update_moves_targets_by_tau_towards_the_sources(tau) -> None:
    targets = [torch.zeros(3), torch.ones(2)]
    sources = [torch.full((3,), 4.0, requires_grad=True), torch.full((2,), 5.0)]
    polyak_update(targets, sources, tau)
    torch.testing.assert_close(targets[0], torch.full((3,), 1.0))
    torch.testing.assert_close(targets[1], torch.full((2,), 2.0))
    assert sources[0].grad is None  # the sources are read, never differentiated through


def test_polyak_update_with_a_zero_or_one_tensor_is_a_skip_or_a_copy() -> None:
    target, source = [torch.zeros(2)], [torch.ones(2)]
    polyak_update(target, source, torch.tensor(0.0))
    assert target[0].tolist() == [0.0, 0.0]
    polyak_update(target, source, torch.tensor(1.0))
    assert target[0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("tau", [0.3, 1.0])
def test_polyak_update_with_a_cpu_tensor_tau_gives_the_bits_of_a_lerp_by_that_tensor(tau: float) -> None:
    g = torch.Generator().manual_seed(0)
    targets = [torch.randn(5, 7, generator=g), torch.randn(7, generator=g)]
    sources = [torch.randn(5, 7, generator=g), torch.randn(7, generator=g)]
    expected = [t.clone().lerp_(s, torch.tensor(tau)) for t, s in zip(targets, sources)]
    polyak_update(targets, sources, torch.tensor(tau))
    for got, want in zip(targets, expected):
        assert torch.equal(got, want)


def test_linear_schedule_interpolates_then_holds() -> None:
    schedule = LinearSchedule(1.0, 0.1, 100)
    values = [schedule(torch.tensor(float(f))).item() for f in (0, 50, 100, 1000)]
    assert values == pytest.approx([1.0, 0.55, 0.1, 0.1])
    with pytest.raises(ValueError, match="duration"):
        LinearSchedule(1.0, 0.0, 0)


def test_per_env_state_resets_only_where_an_episode_starts() -> None:
    state = PerEnvState(4, (2,), fill=-1.0)
    state.set(torch.arange(8.0).view(4, 2))
    out = state.reset(torch.tensor([True, False, False, True]))
    assert out.tolist() == [[-1.0, -1.0], [2.0, 3.0], [4.0, 5.0], [-1.0, -1.0]]
    state.reset()
    assert (state.value == -1).all()
    assert "value" in dict(state.named_buffers())  # saved with the module, moved with it


def test_episode_start_reads_is_init_or_step_count() -> None:
    td = TensorDict({"step_count": torch.tensor([[0], [3], [0]])}, [3])
    assert episode_start(td).tolist() == [True, False, True]
    td["is_init"] = torch.tensor([[False], [True], [False]])
    assert episode_start(td).tolist() == [False, True, False]
    assert episode_start(TensorDict({}, [3])) is None


@pytest.mark.parametrize("scale", [1e-3, 1e3])
def test_clip_grad_norm_gives_torch_s_bits(scale: float) -> None:
    torch.manual_seed(0)
    nets = [nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 3)) for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    for p, q in zip(*(n.parameters() for n in nets)):
        p.grad = torch.randn_like(p) * scale
        q.grad = p.grad.clone()
    expected = nn.utils.clip_grad_norm_(nets[0].parameters(), 1.0)
    norm = clip_grad_norm(nets[1].parameters(), 1.0)
    assert torch.equal(norm, expected)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(*(n.parameters() for n in nets)))
    total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in nets[1].parameters()]))
    assert total.item() == pytest.approx(min(1.0, norm.item()), rel=1e-5)  # clipped to 1, or left alone


def test_clip_grad_norm_skips_parameters_without_gradients() -> None:
    used, unused = nn.Parameter(torch.ones(3)), nn.Parameter(torch.ones(2))
    used.grad = torch.full((3,), 4.0)
    assert clip_grad_norm([used, unused], 100.0).item() == pytest.approx(48**0.5)
    assert unused.grad is None and used.grad.tolist() == [4.0, 4.0, 4.0]
    assert clip_grad_norm([unused], 1.0).item() == 0.0


def test_without_grad_records_no_graph_and_restores_the_grad_mode() -> None:
    weight = nn.Parameter(torch.ones(3))
    seen: list[bool] = []

    @without_grad
    def act(x: torch.Tensor) -> torch.Tensor:
        seen.append(torch.is_grad_enabled())
        return x * weight

    assert not act(torch.ones(3)).requires_grad and torch.is_grad_enabled()
    with torch.no_grad():
        act(torch.ones(3))
        assert not torch.is_grad_enabled()
    assert seen == [False, False] and act.__name__ == "act"


def test_mlp_head_gives_the_values_and_gradients_of_its_layers_called_one_by_one() -> None:
    torch.manual_seed(0)
    net = mlp_head(5, 3, (16, 8))
    assert [name for name, _ in net.named_parameters()] == [
        f"{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")
    ]
    x = torch.randn(7, 5)
    x_before = x.clone()
    fast = net(x)
    assert torch.equal(x, x_before)  # the ReLUs work in place on the layers' outputs only
    fast.square().sum().backward()
    fast_grads = [p.grad.clone() for p in net.parameters()]
    net.zero_grad()
    slow = nn.Sequential.forward(net, x)  # each layer's own module call
    slow.square().sum().backward()
    assert torch.equal(fast, slow)
    assert all(torch.equal(a, p.grad) for a, p in zip(fast_grads, net.parameters(), strict=True))
    # The MLP's own hooks run; the forward reads the layers' current parameters.
    seen = []
    net.register_forward_hook(lambda module, args, out: seen.append(out.shape))
    with torch.no_grad():
        net[4].bias.add_(1.0)
        moved = net(x)
        assert not torch.equal(moved, slow) and torch.equal(moved, nn.Sequential.forward(net, x))
    assert seen == [torch.Size([7, 3])]
    # Layers of other types, added later, are called as modules.
    net.append(nn.Tanh())
    with torch.no_grad():
        assert torch.equal(net(x), torch.tanh(moved))


def test_mlp_head_relu_in_place_leaves_inputs_and_saved_values_alone() -> None:
    """A ReLU that is not right after a linear layer (here the first) must not overwrite its input, and
    the in-place ReLUs after linear layers keep the gradients of out-of-place ones."""
    torch.manual_seed(0)
    net = mlp_head(4, 2, (8,))
    net.insert(0, nn.ReLU())
    x = torch.randn(6, 4, requires_grad=True)
    x_before = x.detach().clone()
    out = net(x)
    assert torch.equal(x.detach(), x_before)
    out.sum().backward()
    reference = x.detach().clone().requires_grad_(True)
    expected = reference
    for layer in net:
        expected = layer(expected)
    expected.sum().backward()
    assert torch.equal(out, expected) and torch.equal(x.grad, reference.grad)


def test_ensemble_mlp_in_place_relu_gives_the_values_and_gradients_of_out_of_place_relus() -> None:
    torch.manual_seed(0)
    net = ensemble_mlp(5, (16, 8), 1, size=2)
    x = torch.randn(7, 5, requires_grad=True)
    x_before = x.detach().clone()
    out = net(x)
    assert torch.equal(x.detach(), x_before)
    (out.square().sum() + net(x, detach=True).sum()).backward()
    grads = [p.grad.clone() for p in net.parameters()]
    x_grad = x.grad.clone()
    net.zero_grad()
    x.grad = None

    def reference(inp: torch.Tensor, detach: bool = False) -> torch.Tensor:
        for layer in net:
            inp = layer(inp, detach=detach) if isinstance(layer, EnsembleLinear) else torch.relu(inp)
        return inp

    expected = reference(x)
    (expected.square().sum() + reference(x, detach=True).sum()).backward()
    assert torch.equal(out, expected) and torch.equal(x_grad, x.grad)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, net.parameters(), strict=True))


@pytest.mark.parametrize("act", [torch.nn.ReLU, torch.nn.Tanh])
@pytest.mark.parametrize("shared_input", [True, False])
def test_ensemble_mlp_matches_its_members_as_separate_mlps(act: type, shared_input: bool) -> None:
    """The batched MLP (activations on columns) gives each member's nn.Linear MLP values and gradients."""
    torch.manual_seed(0)
    size, n = 3, 6
    net = ensemble_mlp(5, (16, 8), 2, size=size, act=act)
    linears = [m for m in net if isinstance(m, EnsembleLinear)]
    members = []
    for e in range(size):
        layers: list[torch.nn.Module] = []
        for i, lin in enumerate(linears):
            layer = torch.nn.Linear(lin.weight.shape[2], lin.weight.shape[1])
            layer.weight.data.copy_(lin.weight[e])
            layer.bias.data.copy_(lin.bias[e])
            layers += [layer] if i == len(linears) - 1 else [layer, act()]
        members.append(torch.nn.Sequential(*layers))
    x = torch.randn(n, 5) if shared_input else torch.randn(size, n, 5)
    x.requires_grad_(True)
    out = net(x)
    assert out.shape == (size, n, 2)
    out.square().sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    ref = torch.stack([m(x_ref if shared_input else x_ref[e]) for e, m in enumerate(members)])
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, x_ref.grad)
    for i, lin in enumerate(linears):
        layer = 2 * i  # the Linear's index in each member's Sequential
        torch.testing.assert_close(lin.weight.grad, torch.stack([m[layer].weight.grad for m in members]))
        torch.testing.assert_close(lin.bias.grad, torch.stack([m[layer].bias.grad for m in members]))
        assert lin.weight.grad.stride() == lin.weight.stride()
    single = linears[0]
    torch.testing.assert_close(
        single(x), torch.stack([m[0](x if shared_input else x[e]) for e, m in enumerate(members)])
    )


def test_safe_tanh_gives_torchrl_safetanh_bits_in_values_and_gradients() -> None:
    from torchrl.modules.distributions.utils import safetanh_noeps

    # Saturated inputs (the clamp bites, the gradient stays positive), ordinary ones, both signs.
    base = torch.cat([torch.tensor([0.0, 7.0, 8.0, 9.0, 20.0, -9.0, -20.0]), 3 * torch.randn(256)])
    weights = torch.randn(base.shape)
    results = []
    for fn in (safe_tanh, safetanh_noeps):
        x = base.clone().requires_grad_(True)
        y = fn(x)
        (y * weights).sum().backward()
        results.append((y.detach(), x.grad))
    (y_ours, g_ours), (y_ref, g_ref) = results
    assert torch.equal(y_ours, y_ref) and torch.equal(g_ours, g_ref)
    assert (g_ours[1:7].abs() > 0).all() and (y_ours.abs() < 1).all()
    with torch.no_grad():
        assert torch.equal(safe_tanh(base), safetanh_noeps(base))


def test_weighted_mean_is_the_mean_of_the_weighted_values() -> None:
    """The one prioritized-replay reduction: ``mean(w * x)`` (not TorchRL's ``sum(w * x) / sum(w)``), the
    weights of any shape of ``B`` elements; without weights the plain mean."""
    x = torch.tensor([1.0, 2.0, 3.0, 6.0])
    w = torch.tensor([[1.0], [0.5], [0.25], [0.5]])
    assert weighted_mean(x, None) == 3.0
    assert weighted_mean(x, w) == (1.0 + 1.0 + 0.75 + 3.0) / 4
