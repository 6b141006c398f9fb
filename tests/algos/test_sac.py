"""SAC and discrete SAC update invariants: critic fixed point, gradient signs, temperature direction,
target critics moved only by the Polyak rule, n-step discounting, batched and deterministic acting; and
prioritized n-step replay through the real data path (the pattern of ``tests/data/test_feedback.py``)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from helpers.batches import box, transitions
from helpers.fit import check_per_and_n_step, fit_with_per_and_n_step
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.modules import ProbabilisticActor, TanhNormal, ValueOperator
from torchrl.objectives import SACLoss, ValueEstimators

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.algos.sac import SAC
from rl_lightning.algos.sac_discrete import DiscreteSAC
from rl_lightning.nn.actor_critic import QNet

OBS, ACT, N_ACTIONS, B = 3, 2, 4, 64
LOW, HIGH = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])


def obs_spec() -> Composite:
    return Composite(observation=Unbounded((1, OBS)), shape=(1,))


def make(**kw) -> SAC:
    torch.manual_seed(0)
    return SAC(
        obs_spec(), Bounded(LOW.unsqueeze(0), HIGH.unsqueeze(0), shape=(1, ACT)), hidden_sizes=(32, 32), **kw
    )


def make_discrete(**kw) -> DiscreteSAC:
    torch.manual_seed(0)
    return DiscreteSAC(obs_spec(), Categorical(N_ACTIONS, shape=(1,)), hidden_sizes=(32, 32), **kw)


def batch(seed: int = 1, terminated: float = 0.3, discrete: bool = False) -> TensorDict:
    return transitions(B, OBS, N_ACTIONS if discrete else box(LOW, HIGH), seed, terminated=terminated)


def nets(m) -> dict[str, list[torch.Tensor]]:
    """The live parameters of the actor, the critics, the target critics and the temperature."""
    if isinstance(m, DiscreteSAC):
        loss = m.loss_module
        return {
            "actor": list(loss.actor_network_params.values(True, True)),
            "critic": list(loss.qvalue_network_params.values(True, True)),
            "target": list(loss.target_qvalue_network_params.values(True, True)),
            "alpha": [loss.log_alpha],
        }
    return {
        "actor": list(m.actor_net.parameters()),
        "critic": list(m.critic.parameters()),
        "target": list(m.target_critic.parameters()),
        "alpha": [m.log_alpha],
    }


def leaves(params: list[torch.Tensor]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def q_values(m, td: TensorDict) -> torch.Tensor:
    """``[num_qvalue_nets, B]`` Q-values of the batch's (env-unit) actions."""
    with torch.no_grad():
        if not isinstance(m, DiscreteSAC):
            return m.critic(td["observation"], m.actions.from_env(td["action"])).squeeze(-1)
        loss = m.loss_module
        out = loss._vmap_qnetworkN0(td.select(*loss.qvalue_network.in_keys), loss.qvalue_network_params)
    q = out["action_value"]
    return q.gather(-1, td["action"].expand(q.shape[0], -1).unsqueeze(-1)).squeeze(-1)


def critic_targets(m, td: TensorDict) -> torch.Tensor:
    """The critics' targets ``[B]`` (from the update's first random draws)."""
    if isinstance(m, DiscreteSAC):
        return m.loss_module._compute_target(m._loss_input(td))
    return m.critic_targets(td, m.log_alpha.detach().exp())


def loss_qvalue(m, td: TensorDict) -> torch.Tensor:
    return m._losses(td)[1]["loss_qvalue"]


def target_entropy(m) -> float:
    return float(m.loss_module.target_entropy if isinstance(m, DiscreteSAC) else m.target_entropy)


@pytest.mark.parametrize("factory", [make, make_discrete], ids=["sac", "discrete"])
def test_update_moves_every_parameter_and_targets_only_by_polyak(factory):
    tau = 0.1
    m = factory(tau=tau)
    live = nets(m)
    actor0, critic0, target0 = leaves(live["actor"]), leaves(live["critic"]), leaves(live["target"])
    assert all(torch.equal(a, b) for a, b in zip(critic0, target0))  # targets start as copies
    assert not any(p.requires_grad for p in live["target"])
    with torch.no_grad():  # targets that differ from the critics, so the Polyak rule is visible
        for p in live["target"]:
            p.add_(0.1 * torch.randn_like(p))
    target0 = leaves(live["target"])
    alpha0 = leaves(live["alpha"])[0]
    out = m.update(batch(discrete=isinstance(m, DiscreteSAC)))
    assert set(out.keys()) == {"loss_qvalue", "loss_actor", "loss_alpha", "alpha", "entropy"}
    assert all(torch.isfinite(v) and v.dim() == 0 for v in out.values())
    actor1, critic1 = leaves(live["actor"]), leaves(live["critic"])
    assert all(not torch.equal(a, b) for a, b in zip(actor0, actor1))
    assert all(not torch.equal(a, b) for a, b in zip(critic0, critic1))
    assert not torch.equal(alpha0, live["alpha"][0].detach())
    for t0, t1, w in zip(target0, leaves(live["target"]), critic1):
        torch.testing.assert_close(t1, t0 + tau * (w - t0), rtol=1e-5, atol=1e-6)
    # The optimizer never touched the targets: one Polyak step away from the new critics, not equal to them.
    assert all(not torch.allclose(t, w) for t, w in zip(leaves(live["target"]), critic1))


@pytest.mark.parametrize("factory", [make, make_discrete], ids=["sac", "discrete"])
def test_critic_loss_is_zero_at_the_fixed_point_and_its_step_moves_q_towards_the_target(factory):
    m = factory(critic_lr=1e-3)
    discrete = isinstance(m, DiscreteSAC)
    with torch.no_grad():  # identical critics, so one reward can be the fixed point of both
        for p in nets(m)["critic"]:
            p[1:].copy_(p[:1].expand_as(p[1:]))
    td = batch(terminated=1.0, discrete=discrete)  # terminal transitions: the target is the reward
    q = q_values(m, td)
    td["next", "reward"] = q[0].unsqueeze(-1)
    assert loss_qvalue(m, td).abs() < 1e-10
    # MSE as in the reference SACs (TorchRL's default is smooth-L1): two critics 2 off cost 2 * 2**2.
    td["next", "reward"] = q[0].unsqueeze(-1) + 2.0
    torch.testing.assert_close(loss_qvalue(m, td), torch.tensor(8.0))
    # Rewards one above Q: a critic step raises Q on the batch; one below: it lowers it.
    for shift in (1.0, -1.0):
        m2 = factory(critic_lr=1e-3)
        m2.load_state_dict(m.state_dict())
        td2 = td.clone()
        td2["next", "reward"] = q[0].unsqueeze(-1) + shift
        m2.update(td2)
        assert torch.sign((q_values(m2, td2) - q).mean()) == shift


def test_actor_step_raises_the_critics_value_of_its_actions():
    # A tiny fixed temperature and frozen critics: the actor step alone must climb min Q.
    m = make(actor_lr=1e-2, critic_lr=0.0, alpha_init=1e-6, autotune_alpha=False)
    td = batch()

    def value_of_policy() -> torch.Tensor:
        probe = td.clone()
        probe["action"] = m.act_eval(td.select("observation").clone())["action"]
        return q_values(m, probe).min(0).values.mean()

    before = value_of_policy()
    for _ in range(5):
        m.update(td)
    assert value_of_policy() > before


@pytest.mark.parametrize(("target_entropy", "direction"), [(100.0, 1.0), (-100.0, -1.0)])
def test_alpha_step_moves_towards_the_target_entropy(target_entropy: float, direction: float):
    # Entropy below the target: alpha grows (more exploration); above it: alpha shrinks.
    m = make(target_entropy=target_entropy)
    before = m.log_alpha.detach().clone()
    m.update(batch())
    assert torch.sign(m.log_alpha.detach() - before) == direction


def test_discrete_target_entropy_is_a_fraction_of_the_largest():
    m = make_discrete(target_entropy_scale=0.5)
    assert target_entropy(m) == pytest.approx(0.5 * math.log(N_ACTIONS))
    assert target_entropy(make()) == -ACT  # continuous: -|A|


@pytest.mark.parametrize("factory", [make, make_discrete], ids=["sac", "discrete"])
def test_n_step_transitions_are_discounted_by_gamma_to_the_steps(factory):
    gamma = 0.9
    m = factory(gamma=gamma)
    td = batch(terminated=0.0, discrete=isinstance(m, DiscreteSAC))
    td["next", "reward"].zero_()
    targets = []
    for steps in (1, 3):
        td["steps_to_next_obs"] = torch.full((B, 1), steps)
        torch.manual_seed(5)  # the same sampled next actions
        targets.append(critic_targets(m, td.clone()))
    torch.testing.assert_close(targets[1], gamma**2 * targets[0])


def test_act_is_batched_bounded_and_eval_is_tanh_of_the_mean():
    m = make()
    obs = TensorDict({"observation": torch.randn(16, OBS)}, [16])
    a1, a2 = m.act(obs.clone())["action"], m.act(obs.clone())["action"]
    assert a1.shape == (16, ACT) and not torch.equal(a1, a2)
    assert ((a1 >= LOW) & (a1 <= HIGH)).all()
    e1, e2 = m.act_eval(obs.clone())["action"], m.act_eval(obs.clone())["action"]
    assert torch.equal(e1, e2)
    loc, _ = m.actor_net(obs["observation"])
    torch.testing.assert_close(e1, (LOW + HIGH) / 2 + (HIGH - LOW) / 2 * torch.tanh(loc))


def test_discrete_act_samples_the_policy_and_eval_takes_its_mode():
    m = make_discrete()
    obs = TensorDict({"observation": torch.randn(1, OBS).expand(4000, OBS)}, [4000])
    logits = m.actor_net(obs["observation"][:1]).squeeze(0)
    counts = torch.bincount(m.act(obs.clone())["action"], minlength=N_ACTIONS).float() / 4000
    torch.testing.assert_close(counts, logits.softmax(-1).detach(), atol=0.03, rtol=0)
    assert (m.act_eval(obs.clone())["action"] == logits.argmax()).all()


def test_prioritized_update_returns_the_larger_critic_td_error():
    m = make()
    td = batch()
    td["index"] = torch.arange(10, 10 + B)
    td["priority_weight"] = torch.ones(B)
    torch.manual_seed(3)  # the target's sampled next actions are the loss's first random draws
    y = critic_targets(m, td)
    expected = (q_values(m, td) - y).abs().amax(0)
    torch.manual_seed(3)
    out = m.update(td)
    assert torch.equal(out["priority", "index"], td["index"])
    torch.testing.assert_close(out["priority", "value"], expected)
    assert "priority" not in m.update(batch(2)).keys()  # a uniform sample carries no priorities


def torchrl_sac_loss(m: SAC, reduction: str = "mean") -> SACLoss:
    """TorchRL's ``SACLoss`` (the form SAC had before its tensor losses) holding ``m``'s weights."""
    unit_box = Bounded(-1.0, 1.0, shape=(ACT,))
    actor = ProbabilisticActor(
        TensorDictModule(m.actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        out_keys=["action"],
        spec=unit_box,
        distribution_class=TanhNormal,
    )
    critic = ValueOperator(QNet(OBS, ACT, (32, 32)), in_keys=["observation", "action"])
    ref = SACLoss(
        actor, critic, num_qvalue_nets=2, loss_function="l2", action_spec=unit_box, reduction=reduction
    )
    ref.make_value_estimator(ValueEstimators.TD0, gamma=m.hparams.gamma)
    with torch.no_grad():
        ref.log_alpha.copy_(m.log_alpha)
        for name, p in m.critic.named_parameters():
            ref.qvalue_network_params["module", *name.split(".")].copy_(p)
            ref.target_qvalue_network_params["module", *name.split(".")].copy_(
                m.target_critic.get_parameter(name)
            )
    return ref


def test_tensor_losses_equal_torchrls_sac_loss_on_prioritized_n_step_samples():
    m = make(alpha_init=0.3)
    with torch.no_grad():  # targets apart from the critics, so a mix-up of the two would show
        for p in m.target_critic.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref = torchrl_sac_loss(m, reduction="none")  # w * L per row: the losses reduce it as mean(w * L)
    td = batch()
    td["priority_weight"] = torch.rand(B)
    td["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    torch.manual_seed(3)  # the same draws: next actions first, then the current ones
    _, losses, td_error = m._losses(td)
    x = td.copy()
    x.set("action", m.actions.from_env(td["action"]))
    fresh = x.clone()
    torch.manual_seed(3)
    expected = ref(x)
    for key in ("loss_qvalue", "loss_actor", "loss_alpha"):
        torch.testing.assert_close(losses[key], expected[key].detach().mean(), rtol=1e-6, atol=1e-6)
    mean_reduced = torchrl_sac_loss(m)  # alpha and entropy, which the "none" reduction leaves out
    torch.manual_seed(3)
    expected = mean_reduced(fresh)
    for key in ("alpha", "entropy"):
        torch.testing.assert_close(losses[key], expected[key].detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(td_error, x["td_error"], rtol=1e-6, atol=1e-6)


def test_checkpoints_of_the_torchrl_layout_load():
    """A checkpoint written when SAC held TorchRL's ``SACLoss`` loads into the tensor-loss module."""
    m = make(alpha_init=0.3)
    ref = torchrl_sac_loss(m)
    old = {k: v for k, v in m.state_dict().items() if k.startswith(("frames", "actions.", "actor_net."))}
    old.update({f"loss_module.{k}": v for k, v in ref.state_dict().items()})
    checkpoint = {"state_dict": old}
    fresh = make(alpha_init=1.0)
    fresh.on_load_checkpoint(checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"])  # strict: every key of the new layout, and no other
    for a, b in zip(fresh.state_dict().values(), m.state_dict().values()):
        torch.testing.assert_close(a, b)


def test_rejects_the_wrong_action_space_with_a_pointer_to_the_other_sac():
    with pytest.raises(IncompatibleEnvError, match="sac_discrete"):
        SAC(obs_spec(), Categorical(3, shape=(1,)))
    with pytest.raises(IncompatibleEnvError, match="algo=sac"):
        DiscreteSAC(obs_spec(), Bounded(-1.0, 1.0, shape=(1, 2)))


def test_state_dict_round_trip_keeps_the_same_keys_before_and_after_an_update():
    m = make()
    keys = set(m.state_dict())
    m.update(batch())
    assert set(m.state_dict()) == keys
    fresh = make()
    fresh.load_state_dict(m.state_dict())
    obs = TensorDict({"observation": torch.randn(5, OBS)}, [5])
    assert torch.equal(fresh.act_eval(obs.clone())["action"], m.act_eval(obs.clone())["action"])


# ------------------------------------------------------------------ through the real data path
@pytest.mark.parametrize("experiment", ["sac_pendulum", "sac_discrete_cartpole"])
def test_per_and_n_step_through_the_real_replay(tmp_path: Path, experiment: str) -> None:
    gamma = 0.9
    run, recorder = fit_with_per_and_n_step(tmp_path, experiment, gamma)
    check_per_and_n_step(run, recorder)
    if experiment == "sac_discrete_cartpole":  # CartPole pays 1 per step: m steps return 1 + g + ...
        stored = run.datamodule.replay.storage[: len(run.datamodule.replay)]
        steps = stored["steps_to_next_obs"].reshape(-1).float()
        torch.testing.assert_close(stored["next", "reward"].reshape(-1), (1 - gamma**steps) / (1 - gamma))
