"""Unit invariants of the TD-MPC2 building blocks: layers, math, world model, losses and planner (CPU)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from tensordict import TensorDict
from torch import Tensor, nn

from rl_lightning.algos.tdmpc2 import (
    MPPIPlanner,
    RunningScale,
    TDMPC2Batch,
    TDMPC2Loss,
    WorldModel,
    batch_from_tensordict,
    discount_from_episode_length,
    model_param_groups,
)
from rl_lightning.algos.tdmpc2 import math as tdm
from rl_lightning.algos.tdmpc2.losses import LossSettings
from rl_lightning.algos.tdmpc2.planner import PlannerSettings
from rl_lightning.algos.tdmpc2.world_model import PolicyOutput
from rl_lightning.nn import Ensemble, Mish, NormedLinear, SimNorm, mlp
from rl_lightning.nn.layers import eval_mode

OBS, ACT = 18, 4


def small_model(episodic: bool = False, **kwargs) -> WorldModel:
    torch.manual_seed(0)
    return WorldModel(OBS, ACT, latent_dim=32, enc_dim=32, mlp_dim=32, episodic=episodic, **kwargs)


def random_batch(horizon: int = 3, batch: int = 8, terminated: bool = False) -> TDMPC2Batch:
    g = torch.Generator().manual_seed(1)
    term = torch.zeros(horizon, batch, 1)
    if terminated:
        term[-1, ::2] = 1.0
    return TDMPC2Batch(
        obs=torch.randn(horizon + 1, batch, OBS, generator=g),
        action=torch.rand(horizon, batch, ACT, generator=g) * 2 - 1,
        reward=torch.randn(horizon, batch, 1, generator=g) * 3,
        terminated=term,
    )


# ---------------------------------------------------------------- math
def test_symlog_symexp_inverse() -> None:
    x = torch.cat([torch.linspace(-1e4, 1e4, 1001), torch.tensor([0.0, 1e-6, -1e-6])])
    torch.testing.assert_close(tdm.symexp(tdm.symlog(x)), x, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(tdm.symlog(-x), -tdm.symlog(x))
    assert tdm.symlog(torch.tensor(torch.e - 1)).item() == pytest.approx(1.0)


def test_two_hot_round_trip_edges_and_clipping() -> None:
    centres = tdm.symexp(torch.linspace(-10, 10, 101))
    inside = tdm.symexp(torch.empty(500).uniform_(-10, 10))
    x = torch.cat([centres, inside, torch.tensor([0.0, -0.3, 7.0])]).unsqueeze(-1)
    enc = tdm.two_hot(x)
    assert enc.shape == (x.shape[0], 101)
    torch.testing.assert_close(enc.sum(-1), torch.ones(x.shape[0]))
    assert ((enc > 0).sum(-1) <= 2).all() and (enc >= 0).all()
    # Bin centres (including both edges) are encoded one-hot on their own bin.
    assert torch.equal(enc[:101].argmax(-1), torch.arange(101))
    torch.testing.assert_close(enc[:101].max(-1).values, torch.ones(101), atol=1e-4, rtol=0)
    dec = tdm.two_hot_inv(torch.log(enc))  # softmax(log p) = p
    torch.testing.assert_close(dec, x, rtol=1e-4, atol=1e-5)
    # Out of range: clipped to the edge bins.
    far = torch.tensor([[1e6], [-1e6], [float(tdm.symexp(torch.tensor(10.5)))]])
    enc_far = tdm.two_hot(far)
    assert enc_far[0, -1] == 1 and enc_far[1, 0] == 1 and enc_far[2, -1] == 1
    edge = tdm.symexp(torch.tensor(10.0))
    torch.testing.assert_close(
        tdm.two_hot_inv(torch.log(enc_far)).squeeze(-1), torch.stack([edge, -edge, edge])
    )


def test_soft_ce_is_minimised_by_the_two_hot_target() -> None:
    target = torch.tensor([[2.5], [-40.0]])
    logits = torch.zeros(2, 101, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.3)
    for _ in range(300):
        opt.zero_grad()
        tdm.soft_ce(logits, target).sum().backward()
        opt.step()
    torch.testing.assert_close(tdm.two_hot_inv(logits.detach()), target, rtol=2e-2, atol=0)


def test_policy_helpers() -> None:
    assert tdm.squash_log_std(torch.tensor([-1e3, 0.0, 1e3])).tolist() == pytest.approx([-10.0, -4.0, 2.0])
    mean, log_std = torch.zeros(100_000, 1), torch.full((100_000, 1), -1.0)
    action, sq_mean, log_prob = tdm.tanh_gaussian_sample(mean, log_std)
    assert action.abs().max() < 1 and sq_mean.abs().max() == 0
    pre = torch.atanh(action)  # log-prob must equal the Gaussian density of atanh(a) minus log|d tanh|
    ref = torch.distributions.Normal(0.0, torch.e**-1).log_prob(pre) - torch.log(1 - action.pow(2) + 1e-6)
    torch.testing.assert_close(log_prob, ref, rtol=1e-3, atol=1e-3)
    counts = torch.bincount(
        tdm.gumbel_softmax_sample(torch.tensor([[0.7, 0.2, 0.1]]).expand(20_000, 3)), minlength=3
    )
    torch.testing.assert_close(counts / 20_000.0, torch.tensor([0.7, 0.2, 0.1]), atol=0.02, rtol=0)


def test_discount_heuristic() -> None:
    assert discount_from_episode_length(1000) == pytest.approx(0.995)
    assert discount_from_episode_length(250) == pytest.approx(0.98)
    assert discount_from_episode_length(20) == pytest.approx(0.95)


def test_running_scale() -> None:
    scale = RunningScale(tau=0.01)
    assert scale.value.item() == 1.0
    scale.update(torch.rand(64, 1))  # range < 1 -> clamped to 1, so the scale stays at 1
    assert scale.value.item() == pytest.approx(1.0)
    x = torch.randn(256, 1) * 40
    rng = torch.quantile(x, 0.95) - torch.quantile(x, 0.05)
    scale.update(x)
    assert scale.value.item() == pytest.approx(1.0 + 0.01 * (rng.item() - 1.0), rel=1e-5)
    for _ in range(2000):
        scale.update(x)
    assert scale.value.item() == pytest.approx(rng.item(), rel=1e-3)
    torch.testing.assert_close(scale(x), x / rng, rtol=1e-3, atol=0)
    assert "value" in scale.state_dict()


# ---------------------------------------------------------------- layers
def test_simnorm_and_mlp() -> None:
    y = SimNorm(8)(torch.randn(3, 5, 64) * 10)
    groups = y.unflatten(-1, (8, 8))
    torch.testing.assert_close(groups.sum(-1), torch.ones(3, 5, 8))
    assert (y >= 0).all()
    net = mlp(10, [16, 16], 3, dropout=0.1)
    assert isinstance(net[0], NormedLinear) and net[0].dropout is not None and net[1].dropout is None
    assert type(net[-1]) is nn.Linear
    assert isinstance(mlp(10, 16, 8, act=SimNorm(4))[-1].act, SimNorm)


def test_ensemble_matches_members_and_heads_are_independent() -> None:
    torch.manual_seed(0)
    members = [mlp(6, [16], 3, dropout=0.5) for _ in range(4)]
    ens = Ensemble(members).eval()
    x = torch.randn(7, 6)
    out = ens(x)
    assert out.shape == (4, 7, 3)
    for i, m in enumerate(members):
        torch.testing.assert_close(out[i], m.eval()(x))
    with torch.no_grad():
        ens.stacked("0.weight")[2] += torch.randn(16, 6)  # a constant shift would vanish in LayerNorm
    out2 = ens(x)
    changed = (out2 - out).abs().amax(dim=(1, 2)) > 1e-6
    assert changed.tolist() == [False, False, True, False]
    # Gradients reach every head, and only through its own slice.
    out2[1].sum().backward()
    grad = ens.stacked("0.weight").grad
    assert grad[1].abs().sum() > 0 and grad[[0, 2, 3]].abs().sum() == 0
    ens.zero_grad()
    ens(x).sum().backward()
    assert all(ens.stacked("0.weight").grad[i].abs().sum() > 0 for i in range(4))
    # Registered state: optimizers, state_dict, deepcopy and detach.
    clone = copy.deepcopy(ens)
    torch.testing.assert_close(clone(x), ens(x))
    fresh = Ensemble([mlp(6, [16], 3, dropout=0.5) for _ in range(4)]).eval()
    fresh.load_state_dict(ens.state_dict())
    torch.testing.assert_close(fresh(x), ens(x))
    ens.zero_grad(set_to_none=True)
    x_req = x.clone().requires_grad_(True)
    ens(x_req, detach=True).sum().backward()
    assert x_req.grad.abs().sum() > 0 and all(p.grad is None for p in ens.parameters())


def test_ensemble_dropout_masks_differ_per_head() -> None:
    torch.manual_seed(0)
    member = mlp(6, [64], 3, dropout=0.5)
    ens = Ensemble([copy.deepcopy(member) for _ in range(3)])
    x = torch.randn(5, 6)
    out = ens.train()(x)
    assert not torch.allclose(out[0], out[1])
    out = ens.eval()(x)
    torch.testing.assert_close(out[0], out[1])


def test_eval_mode_switches_every_mode_train_reaches_and_restores_each() -> None:
    """``eval_mode``: inside, the modes of ``train(False)`` (the ensembles' stateless copies included, so Q
    dropout is off); after, each module's own mode back (the target ensemble stays in eval mode), also when
    the block raises."""
    model = small_model(episodic=True).train()
    modules = [*model.modules(), model.q_nets._base, *model.target_q_nets._base.modules()]
    before = [m.training for m in modules]
    assert model.q_nets._base.training and not model.target_q_nets.training
    x, a = torch.randn(64, 32), torch.rand(64, ACT) * 2 - 1
    with eval_mode(model):
        assert not any(m.training for m in modules)
        inside = model.Q(x, a, return_type="all")
    torch.testing.assert_close(inside, model.eval().Q(x, a, return_type="all"))  # no dropout
    model.train()
    assert [m.training for m in modules] == before
    with pytest.raises(RuntimeError), eval_mode(model):
        raise RuntimeError
    assert [m.training for m in modules] == before


# ---------------------------------------------------------------- world model
def test_world_model_shapes_and_zero_init() -> None:
    model = small_model(episodic=True).eval()
    obs = torch.randn(4, 6, OBS)
    z = model.encode(obs)
    assert z.shape == (4, 6, 32)
    torch.testing.assert_close(z.unflatten(-1, (-1, 8)).sum(-1), torch.ones(4, 6, 4))
    pi = model.pi(z)
    assert isinstance(pi, PolicyOutput) and pi.action.shape == (4, 6, ACT) and pi.log_prob.shape == (4, 6, 1)
    assert pi.action.abs().max() <= 1 and (pi.log_std >= -10).all() and (pi.log_std <= 2).all()
    assert model.next(z, pi.action).shape == z.shape
    assert model.reward(z, pi.action).shape == (4, 6, 101)
    assert model.termination(z).shape == (4, 6, 1)
    assert model.Q(z, pi.action, return_type="all").shape == (5, 4, 6, 101)
    for rt in ("min", "avg"):
        q = model.Q(z, pi.action, return_type=rt)
        assert q.shape == (4, 6, 1) and q.abs().max() < 1e-6  # zero-initialised heads predict 0
    assert model.predict_reward(z, pi.action).abs().max() < 1e-6
    torch.testing.assert_close(model.Q(z, pi.action, "all", target=True), model.Q(z, pi.action, "all"))
    with pytest.raises(RuntimeError):
        small_model().termination(z)


def test_q_min_and_avg_use_two_random_heads() -> None:
    model = small_model().eval()
    with torch.no_grad():
        model.q_nets.stacked("2.bias").copy_(torch.linspace(-2, 2, 5)[:, None] * torch.linspace(-1, 1, 101))
    z, a = model.encode(torch.randn(3, OBS)), torch.zeros(3, ACT)
    heads = model.two_hot_inv(model.Q(z, a, "all"))[:, 0, 0]  # distinct value per head
    mins, avgs = set(), set()
    torch.manual_seed(0)
    for _ in range(200):
        mins.add(round(model.Q(z, a, "min")[0, 0].item(), 4))
        avgs.add(round(model.Q(z, a, "avg")[0, 0].item(), 4))
    pair_min = {round(min(heads[i], heads[j]).item(), 4) for i in range(5) for j in range(i + 1, 5)}
    pair_avg = {round(((heads[i] + heads[j]) / 2).item(), 4) for i in range(5) for j in range(i + 1, 5)}
    assert mins == pair_min and avgs == pair_avg


@pytest.mark.parametrize(("size", "low", "high"), [(1, 0.9e6, 1.5e6), (5, 4.5e6, 5.5e6)])
def test_size_presets_parameter_counts(size: int, low: float, high: float) -> None:
    model = WorldModel.from_preset(size, OBS, ACT)
    assert low < model.num_params() < high
    assert model.num_q == (2 if size == 1 else 5)


def test_target_moves_only_by_polyak() -> None:
    model = small_model()
    optim = torch.optim.Adam(model_param_groups(model, 3e-4, 0.3), lr=3e-4)
    assert optim.param_groups[0]["lr"] == pytest.approx(0.3 * 3e-4)
    target_before = [p.clone() for p in model.target_q_nets.parameters()]
    loss = TDMPC2Loss(discount=0.99).model_loss(model.train(), random_batch()).loss
    loss.backward()
    optim.step()
    online = [p.detach().clone() for p in model.q_nets.parameters()]
    assert any(not torch.equal(o, t) for o, t in zip(online, target_before))
    assert all(torch.equal(t, b) for t, b in zip(model.target_q_nets.parameters(), target_before))
    assert not any(p.requires_grad for p in model.target_q_nets.parameters())
    model.soft_update_target_Q()
    for t, b, o in zip(model.target_q_nets.parameters(), target_before, online):
        torch.testing.assert_close(t, b + 0.01 * (o - b))


# ---------------------------------------------------------------- losses
@pytest.mark.parametrize("episodic", [False, True])
def test_losses_finite_and_gradients_reach_every_part(episodic: bool) -> None:
    model = small_model(episodic=episodic).train()
    loss_fn = TDMPC2Loss(discount=0.99)
    out = loss_fn.model_loss(model, random_batch(terminated=episodic))
    assert out.zs.shape == (4, 8, 32)
    assert all(torch.isfinite(v) for v in out.metrics.values())
    assert (out.metrics["termination_loss"] > 0) == episodic
    out.loss.backward()
    parts = [model.encoder, model.dynamics, model.reward_net, model.q_nets]
    parts += [model.termination_net] if episodic else []
    for part in parts:
        assert sum(p.grad.abs().sum() for p in part.parameters() if p.grad is not None) > 0
    last = model.q_nets.stacked("2.weight").grad
    assert all(last[i].abs().sum() > 0 for i in range(model.num_q))
    assert all(p.grad is None for p in model.pi_net.parameters())
    model.zero_grad()
    pi_loss, metrics = loss_fn.policy_loss(model, out.zs.detach())
    pi_loss.backward()
    assert torch.isfinite(pi_loss) and set(metrics) >= {"pi_loss", "pi_entropy", "pi_scale"}
    assert sum(p.grad.abs().sum() for p in model.pi_net.parameters()) > 0
    others = [*model.encoder.parameters(), *model.q_nets.parameters(), *model.dynamics.parameters()]
    assert all(p.grad is None for p in others)


def test_td_target_bootstraps_until_termination() -> None:
    model = small_model().eval()
    with torch.no_grad():
        model.target_q_nets.stacked("2.bias").add_(torch.linspace(0, 1, 101))  # Q > 0 for every head
    loss_fn = TDMPC2Loss(discount=0.9)
    z, r = model.encode(torch.randn(6, OBS)), torch.randn(6, 1)
    term = torch.tensor([[1.0], [0.0]] * 3)
    target = loss_fn.td_target(model, z, r, term)
    torch.testing.assert_close(target[::2], r[::2])
    assert (target[1::2] > r[1::2] + 0.1).all()


def test_batch_from_tensordict() -> None:
    b, h = 5, 3
    obs = torch.arange(b * (h + 1), dtype=torch.float32).reshape(b, h + 1, 1).expand(b, h + 1, OBS)
    td = TensorDict(
        {
            "observation": obs[:, :-1],
            "action": torch.zeros(b, h, ACT),
            "next": {
                "observation": obs[:, 1:],
                "reward": torch.ones(b, h, 1),
                "terminated": torch.zeros(b, h, 1),
            },
        },
        batch_size=[b, h],
    )
    batch = batch_from_tensordict(td)
    assert batch.obs.shape == (h + 1, b, OBS) and batch.action.shape == (h, b, ACT)
    assert batch.reward.shape == batch.terminated.shape == (h, b, 1)
    torch.testing.assert_close(batch.obs[:, 1, 0], torch.arange(4.0, 8.0))


# ---------------------------------------------------------------- planner
class QuadraticModel(nn.Module):
    """Latent = per-env optimum a*; reward -||a - a*||^2, Q = 0, so the best plan is a* at every step."""

    episodic = False

    def next(self, z: Tensor, a: Tensor) -> Tensor:
        return z

    def predict_reward(self, z: Tensor, a: Tensor) -> Tensor:
        return -(a - z).pow(2).sum(-1, keepdim=True)

    def pi(self, z: Tensor) -> PolicyOutput:
        a = torch.rand_like(z) * 2 - 1
        return PolicyOutput(a, a, torch.zeros_like(a), torch.zeros_like(a[..., :1]))

    def Q(self, z: Tensor, a: Tensor, return_type: str = "min") -> Tensor:
        return torch.zeros_like(z[..., :1])

    def termination(self, z: Tensor) -> Tensor:
        return torch.zeros_like(z[..., :1])


class FlatModel(QuadraticModel):
    def predict_reward(self, z: Tensor, a: Tensor) -> Tensor:
        return torch.zeros_like(a[..., :1])


def test_planner_shapes_bounds_and_determinism() -> None:
    model = small_model(episodic=True).eval()
    z = model.encode(torch.randn(3, OBS))

    def run() -> Tensor:
        torch.manual_seed(123)
        plan = PlannerSettings(num_samples=128, num_pi_trajs=8, num_elites=16)
        planner = MPPIPlanner(ACT, num_envs=3, discount=0.99, settings=plan)
        return torch.stack([planner(model, z), planner(model, z, eval_mode=True)])

    a = run()
    assert a.shape == (2, 3, ACT) and a.abs().max() <= 1.0
    torch.testing.assert_close(a, run(), rtol=0, atol=0)


@pytest.mark.parametrize("num_envs, num_pi_trajs", [(1, 8), (2, 0)])
@pytest.mark.slow
def test_compiled_plan_traces_one_iteration_and_calls_it_each_time(num_envs: int, num_pi_trajs: int) -> None:
    """Under ``torch.compile`` the MPPI iteration is one nested compile region, traced once and called
    ``iterations`` times in one graph (not unrolled; with one env too, where the first iteration's inputs
    could differ in strides and get a region of their own), and the plan it computes is the eager one."""
    model = small_model(episodic=True).eval()
    z = model.encode(torch.randn(num_envs, OBS)).detach()
    # Two iterations suffice: a first iteration traced apart from the rest would give two subgraphs. Dynamo
    # traces the region's body at every call, so each iteration more costs seconds.
    plan = PlannerSettings(num_samples=64, num_pi_trajs=num_pi_trajs, num_elites=8, iterations=2)
    planner = MPPIPlanner(ACT, num_envs=num_envs, settings=plan)
    graphs: list[torch.fx.GraphModule] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    plan = torch.compile(planner, backend=backend, fullgraph=True)
    results = []
    for fn in (plan, planner):
        planner.reset()
        torch.manual_seed(5)
        results.append(torch.stack([fn(model, z), fn(model, z, eval_mode=True)]))
    torch.testing.assert_close(results[0], results[1], rtol=1e-6, atol=1e-6)
    assert len(graphs) == 2  # one graph per eval_mode value
    for gm in graphs:
        calls = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.invoke_subgraph]
        assert len(calls) == planner.iterations
        assert len({n.args[0].target for n in calls}) == 1  # the same traced subgraph each time


def test_planner_warm_start_reset_and_t0() -> None:
    planner = MPPIPlanner(2, num_envs=3, settings=PlannerSettings(horizon=3))
    prev = torch.arange(18, dtype=torch.float32).reshape(3, 3, 2) / 20
    planner.prev_mean.copy_(prev)
    init = planner.initial_mean()
    torch.testing.assert_close(init[:, :2], prev[:, 1:])
    assert init[:, 2].abs().sum() == 0
    init_t0 = planner.initial_mean(torch.tensor([False, True, False]))
    assert init_t0[1].abs().sum() == 0 and torch.equal(init_t0[[0, 2]], init[[0, 2]])
    planner.reset(torch.tensor([True, False, False]))
    assert planner.prev_mean[0].abs().sum() == 0 and torch.equal(planner.prev_mean[1:], prev[1:])


def test_planner_uses_the_shifted_previous_mean() -> None:
    # With a flat value landscape and a tiny std the plan cannot move away from its initial mean,
    # so the executed action and the stored mean reveal which initial mean was used.
    torch.manual_seed(0)
    plan = PlannerSettings(num_pi_trajs=0, num_samples=64, num_elites=8, min_std=1e-4, max_std=1e-4)
    planner = MPPIPlanner(2, num_envs=2, settings=plan)
    prev = torch.tensor([[[0.1, 0.2], [0.3, -0.4], [0.5, 0.6]], [[-0.1, 0.0], [0.7, 0.8], [-0.9, 0.2]]])
    planner.prev_mean.copy_(prev)
    action = planner(FlatModel(), torch.zeros(2, 2), eval_mode=True)
    torch.testing.assert_close(action, prev[:, 1], atol=1e-3, rtol=0)
    torch.testing.assert_close(planner.prev_mean[:, :2], prev[:, 1:], atol=1e-3, rtol=0)
    action = planner(FlatModel(), torch.zeros(2, 2), t0=torch.tensor([True, False]), eval_mode=True)
    torch.testing.assert_close(action, torch.stack([torch.zeros(2), prev[1, 2]]), atol=1e-3, rtol=0)


def test_planner_finds_known_optimum() -> None:
    torch.manual_seed(0)
    target = torch.tensor([[0.3, -0.5, 0.7, 0.1], [-0.8, 0.2, 0.0, 0.6]])
    planner = MPPIPlanner(ACT, num_envs=2, discount=0.99)
    action = planner(QuadraticModel(), target, eval_mode=True)
    torch.testing.assert_close(action, target, atol=0.1, rtol=0)
    torch.testing.assert_close(planner.prev_mean, target.unsqueeze(1).expand(2, 3, ACT), atol=0.15, rtol=0)
    explore = planner(QuadraticModel(), target)
    assert explore.shape == (2, ACT) and (explore - target).abs().max() < 0.6


def test_cpu_mish_matches_torch_mish_and_its_gradient() -> None:
    x = torch.cat([torch.linspace(-120.0, 120.0, 4001), torch.tensor([0.0, 19.99, 20.0, 20.01, -20.0])])
    x = x.requires_grad_()
    ref = x.detach().clone().requires_grad_()
    out, expected = Mish()(x), torch.nn.functional.mish(ref)
    torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-6)
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(x.grad, ref.grad, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(x.grad).all()


# ---------------------------------------------------------------- losses against a hand computation
def _symlog(x: float) -> float:
    return math.copysign(math.log1p(abs(x)), x)


def _symexp(x: float) -> float:
    return math.copysign(math.expm1(abs(x)), x)


def _two_hot(x: float, bins: int, vmin: float, vmax: float) -> list[float]:
    """The two-hot vector of ``x``: symlog, clipped, its mass split between the two nearest bins."""
    pos = (min(max(_symlog(x), vmin), vmax) - vmin) / ((vmax - vmin) / (bins - 1))
    low = min(math.floor(pos), bins - 2)
    out = [0.0] * bins
    out[low], out[low + 1] = 1 - (pos - low), pos - low
    return out


def _ce(logits: Tensor, target: float, bins: int, vmin: float, vmax: float) -> float:
    """Cross-entropy of one row of bin logits against the two-hot ``target``, in float64."""
    log_p = torch.log_softmax(logits.double(), -1).tolist()
    return -sum(w * lp for w, lp in zip(_two_hot(target, bins, vmin, vmax), log_p))


def _decoded(logits: Tensor, bins: int, vmin: float, vmax: float) -> float:
    """``symexp`` of the expected bin centre under ``softmax(logits)``."""
    p = torch.softmax(logits.double(), -1).tolist()
    centres = [vmin + i * (vmax - vmin) / (bins - 1) for i in range(bins)]
    return _symexp(sum(pi * c for pi, c in zip(p, centres)))


def _perturbed_model() -> WorldModel:
    """An episodic model whose zero-initialised heads are moved, so every term carries values."""
    model = small_model(episodic=True).eval()  # eval: no Q dropout, so the heads are deterministic
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in [*model.parameters(), *model.target_q_nets.parameters()]:
            p.add_(torch.randn(p.shape, generator=g) * 0.2)
    return model


def test_model_loss_matches_a_hand_computation() -> None:
    """Each term of the world-model loss, recomputed scalar by scalar in float64 from the networks' outputs:
    the rho-weighted latent consistency, the two-hot reward and value cross-entropies (the value's target
    the TD target with the minimum of two random target heads at pi's action), the termination BCE, and
    their weighted sum."""
    model, horizon, batch = _perturbed_model(), 2, 3
    data = random_batch(horizon, batch, terminated=True)
    loss_fn = TDMPC2Loss(discount=0.9, settings=LossSettings(rho=0.5))
    torch.manual_seed(11)
    out = loss_fn.model_loss(model, data)

    bins = (model.num_bins, model.vmin, model.vmax)
    rho = [0.5**t for t in range(horizon)]
    with torch.no_grad():
        next_z = model.encode(data.obs[1:])  # [H, B, latent]
        torch.manual_seed(11)  # the same draws as the loss: pi's action noise, then the two heads
        next_action = model.pi(next_z).action
        heads = torch.rand(model.num_q).argsort()[:2].tolist()
        target_logits = model.Q(next_z, next_action, return_type="all", target=True)
        zs = [model.encode(data.obs[0])]
        for t in range(horizon):
            zs.append(model.next(zs[-1], data.action[t]))
        reward_logits = [model.reward(zs[t], data.action[t]) for t in range(horizon)]
        q_logits = [model.Q(zs[t], data.action[t], return_type="all") for t in range(horizon)]
        term_logits = [model.termination_logits(zs[t + 1]) for t in range(horizon)]
    consistency = reward_loss = value_loss = termination = 0.0
    for t in range(horizon):
        sq = ((zs[t + 1].double() - next_z[t].double()) ** 2).mean().item()
        consistency += rho[t] * sq / horizon
        for b in range(batch):
            r, done = data.reward[t, b, 0].item(), data.terminated[t, b, 0].item()
            q_next = min(_decoded(target_logits[h, t, b], *bins) for h in heads)
            target = r + 0.9 * (1 - done) * q_next
            reward_loss += rho[t] * _ce(reward_logits[t][b], r, *bins) / (batch * horizon)
            for h in range(model.num_q):
                value_loss += rho[t] * _ce(q_logits[t][h, b], target, *bins) / (batch * horizon * model.num_q)
            x, y = term_logits[t][b, 0].double().item(), done
            termination += (max(x, 0) - x * y + math.log1p(math.exp(-abs(x)))) / (batch * horizon)
    expected = {
        "consistency_loss": consistency,
        "reward_loss": reward_loss,
        "value_loss": value_loss,
        "termination_loss": termination,
        "total_loss": 20 * consistency + 0.1 * reward_loss + 0.1 * value_loss + 1.0 * termination,
    }
    for key, value in expected.items():
        assert out.metrics[key].item() == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert out.loss.item() == pytest.approx(expected["total_loss"], rel=1e-5)


def test_policy_loss_matches_a_hand_computation() -> None:
    """``mean_t rho^t mean_B -(entropy_coef * H + Q / S)``, with Q the mean of two random online heads at
    pi's action and S the running scale after its update from the first step's Q."""
    model, steps, batch = _perturbed_model(), 3, 4
    loss_fn = TDMPC2Loss(discount=0.9, settings=LossSettings(rho=0.5, entropy_coef=0.3))
    zs = model.encode(torch.randn(steps, batch, OBS, generator=torch.Generator().manual_seed(5))).detach()
    loss_fn.scale.value.fill_(4.0)  # a scale of several returns, which the update then moves a little
    torch.manual_seed(13)
    loss, _ = loss_fn.policy_loss(model, zs)
    scale = loss_fn.scale.value.item()
    with torch.no_grad():
        torch.manual_seed(13)
        pi = model.pi(zs)
        heads = torch.rand(model.num_q).argsort()[:2].tolist()
        logits = model.Q(zs, pi.action, return_type="all")
    bins = (model.num_bins, model.vmin, model.vmax)
    expected = 0.0
    for t in range(steps):
        per_step = 0.0
        for b in range(batch):
            q = sum(_decoded(logits[h, t, b], *bins) for h in heads) / 2
            entropy = -pi.log_prob[t, b, 0].double().item()
            per_step += -(0.3 * entropy + q / scale) / batch
        expected += 0.5**t * per_step / steps
    assert 1.0 < scale < 4.0  # the update moved it: the division by the updated scale is checked
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("target", [100.0, -100.0])
def test_learned_entropy_coef_moves_towards_its_target_and_leaves_the_policy_gradient(target: float) -> None:
    """With ``target_entropy`` the coefficient starts at ``entropy_coef``, weights the entropy as the fixed
    one does, and its gradient is ``mean H - target``: it grows while the entropy is below the target and
    shrinks while above. The temperature term adds nothing to the policy's gradient."""
    model, steps, batch = _perturbed_model(), 3, 4
    zs = model.encode(torch.randn(steps, batch, OBS, generator=torch.Generator().manual_seed(5))).detach()
    grads, coefs = [], []
    for kwargs in ({"target_entropy": target}, {}):
        loss_fn = TDMPC2Loss(discount=0.9, settings=LossSettings(entropy_coef=0.3, **kwargs))
        model.pi_net.zero_grad()
        torch.manual_seed(13)
        loss, metrics = loss_fn.policy_loss(model, zs)
        loss.backward()
        grads.append([p.grad.clone() for p in model.pi_net.parameters()])
        coefs.append(metrics["pi_entropy_coef"].item())
        if kwargs:
            entropy = metrics["pi_entropy"].item()
            assert loss_fn.log_entropy_coef.grad.item() == pytest.approx(entropy - target, rel=1e-5)
            assert (loss_fn.log_entropy_coef.grad.item() < 0) == (target > entropy)
    assert coefs[0] == pytest.approx(0.3) and coefs[1] == pytest.approx(0.3)
    for learned, fixed in zip(*grads):
        torch.testing.assert_close(learned, fixed)
    assert not hasattr(TDMPC2Loss(discount=0.9), "log_entropy_coef")  # the reference's state is unchanged
    with pytest.raises(ValueError, match="entropy_coef"):
        LossSettings(entropy_coef=0.0, target_entropy=-1.0)
