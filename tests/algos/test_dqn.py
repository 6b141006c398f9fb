"""DQN update invariants: finite losses, gradients, target-network rules, Double DQN targets."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import discrete_specs, transitions
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.algos.dqn import DQN

OBS, ACTIONS, B = 4, 3, 32


def make(**kw) -> DQN:
    torch.manual_seed(0)
    obs, act = discrete_specs(OBS, ACTIONS)
    return DQN(obs, act, hidden_sizes=(32, 32), **kw)


def batch(seed: int = 1, terminated: float = 0.3) -> TensorDict:
    return transitions(B, OBS, ACTIONS, seed, terminated=terminated)


def online(m: DQN) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.online.parameters()]


def target(m: DQN) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.target.parameters()]


def perturb_target(m: DQN) -> None:
    """Makes the target network differ from the online one (they start equal)."""
    with torch.no_grad():
        for p in m.target.parameters():
            p.add_(torch.randn_like(p))


def test_update_is_finite_and_moves_every_online_parameter():
    m = make()
    before = online(m)
    metrics = m.update(batch())
    assert torch.isfinite(metrics["loss"]) and metrics["loss"] > 0
    grads = [p.grad for p in m.online.parameters()]
    assert all(p.grad is None for p in m.target.parameters())
    assert all(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(not torch.equal(a, b) for a, b in zip(before, online(m)))


def test_soft_target_moves_only_by_polyak_rule():
    tau = 0.1
    m = make(target_update="soft", tau=tau)
    t0 = target(m)
    m.update(batch())
    o1, t1 = online(m), target(m)
    for a0, a1, w in zip(t0, t1, o1):
        assert torch.allclose(a1, a0 + tau * (w - a0), atol=1e-6)
    # The optimizer step alone never touches the target: t1 is not the new online weights.
    assert any(not torch.allclose(a1, w) for a1, w in zip(t1, o1))


def test_hard_target_is_copied_every_k_updates():
    m = make(target_update="hard", hard_update_every=3)
    t0 = target(m)
    m.update(batch(1))
    m.update(batch(2))
    assert all(torch.equal(a, b) for a, b in zip(t0, target(m)))
    m.update(batch(3))
    assert all(torch.equal(a, b) for a, b in zip(online(m), target(m)))


def _expected_loss(m: DQN, td: TensorDict, double: bool, gamma: float) -> torch.Tensor:
    with torch.no_grad():
        q = m.q_values(td["observation"]).gather(-1, td["action"].unsqueeze(-1))
        q_next_online = m.q_values(td["next", "observation"])
        q_next_target = m.target(td["next", "observation"])
        if double:
            nxt = q_next_target.gather(-1, q_next_online.argmax(-1, keepdim=True))
        else:
            nxt = q_next_target.max(-1, keepdim=True).values
        y = td["next", "reward"] + gamma * (~td["next", "terminated"]).float() * nxt
        return ((q - y) ** 2).mean()


@pytest.mark.parametrize("double", [False, True])
def test_loss_matches_hand_computed_target(double: bool):
    m = make(double_dqn=double, gamma=0.9)
    perturb_target(m)  # make target and online differ so the two rules disagree
    td = batch()
    loss, _, _ = m.td_loss(td.clone())
    assert torch.allclose(loss, _expected_loss(m, td, double, 0.9), rtol=1e-5)


def test_double_dqn_target_differs_from_vanilla_on_crafted_batch():
    vanilla, double = make(double_dqn=False), make(double_dqn=True)
    double.load_state_dict(vanilla.state_dict())
    perturb_target(vanilla)
    double.load_state_dict(vanilla.state_dict())
    td = batch(terminated=0.0)
    assert not torch.allclose(vanilla.td_loss(td.clone())[0], double.td_loss(td.clone())[0])


def test_epsilon_schedule_and_greedy_eval():
    m = make(eps_start=1.0, eps_end=0.1, eps_decay_frames=100)
    assert torch.isclose(m.epsilon(), torch.tensor(1.0))
    m.set_frames(50)
    assert torch.isclose(m.epsilon(), torch.tensor(0.55))
    m.set_frames(1000)
    assert torch.isclose(m.epsilon(), torch.tensor(0.1))
    # A module restored from a checkpoint acts with the epsilon of the restored frame count at once.
    restored = make(eps_start=1.0, eps_end=0.1, eps_decay_frames=100)
    restored.load_state_dict(m.state_dict())
    assert torch.isclose(restored.epsilon(), torch.tensor(0.1))
    obs = torch.randn(64, OBS)
    greedy = m.act_eval(TensorDict({"observation": obs}, [64]))["action"]
    assert torch.equal(greedy, m.q_values(obs).argmax(-1))
    m.set_frames(0)  # epsilon 1: actions are uniform, so most differ from greedy somewhere
    explored = m.act(TensorDict({"observation": obs}, [64]))["action"]
    assert (explored != greedy).any() and explored.min() >= 0 and explored.max() < ACTIONS


def test_dueling_head_outputs_value_plus_centred_advantage():
    m = make(dueling=True)
    obs = torch.randn(5, OBS)
    head = m.online
    h = head.trunk(obs)
    adv = head.advantage(h)
    assert torch.allclose(m.q_values(obs), head.value(h) + adv - adv.mean(-1, keepdim=True))
    assert m.update(batch())["loss"].isfinite()


def test_rejects_continuous_actions_with_a_clear_message():
    obs, _ = discrete_specs(OBS, ACTIONS)
    with pytest.raises(IncompatibleEnvError, match="discrete action space"):
        DQN(obs, Bounded(-1.0, 1.0, shape=(1, 2)))


def test_prioritized_update_returns_abs_td_errors_of_the_sampled_rows():
    gamma = 0.9
    m = make(gamma=gamma, target_update="hard", hard_update_every=1000)
    with torch.no_grad():
        for p in m.target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    td = batch()
    td["index"] = torch.arange(100, 100 + B)
    td["priority_weight"] = torch.ones(B)
    with torch.no_grad():
        q = m.q_values(td["observation"]).gather(-1, td["action"].unsqueeze(-1)).squeeze(-1)
        nxt = m.target(td["next", "observation"]).max(-1).values
        y = td["next", "reward"].squeeze(-1) + gamma * (~td["next", "terminated"].squeeze(-1)).float() * nxt
    out = m.update(td)
    assert torch.equal(out["priority", "index"], td["index"])
    torch.testing.assert_close(out["priority", "value"], (q - y).abs(), rtol=1e-5, atol=1e-6)
    # A uniform sample carries no priorities.
    assert "priority" not in m.update(batch(2)).keys()


@pytest.mark.parametrize(
    ("double", "loss", "n_step", "prioritized"),
    [(False, "l2", False, False), (True, "l2", True, False), (True, "smooth_l1", False, True),
     (False, "smooth_l1", True, True)],
)  # fmt: skip
def test_td_loss_equals_torchrls_dqn_loss(double: bool, loss: str, n_step: bool, prioritized: bool):
    """The tensor loss is TorchRL's DQNLoss (TD(0) estimator) without its TensorDict machinery; a prioritized
    sample is reduced as every algorithm here reduces it, ``mean(w * L)`` (TorchRL's ``reduction="none"``
    returns ``w * L``; its ``"mean"`` divides by ``sum(w)`` instead)."""
    from torchrl.modules import QValueActor
    from torchrl.objectives import DQNLoss, ValueEstimators

    gamma = 0.9
    m = make(double_dqn=double, loss=loss, gamma=gamma)
    perturb_target(m)
    td = batch(3)
    g = torch.Generator().manual_seed(5)
    if n_step:
        td["steps_to_next_obs"] = torch.randint(1, 4, (B, 1), generator=g)
    if prioritized:
        td["priority_weight"] = torch.rand(B, generator=g) + 0.1
    spec = Categorical(ACTIONS, dtype=torch.int64)
    actor = QValueActor(m.online, in_keys=["observation"], spec=spec, action_space="categorical")
    reference = DQNLoss(
        actor, loss_function=loss, delay_value=True, double_dqn=double, action_space=spec, reduction="none"
    )
    reference.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
    with torch.no_grad():
        for dst, src in zip(reference.target_value_network_params.values(True, True), m.target.parameters()):
            dst.copy_(src)
    expected_td = td.clone()
    expected = reference(expected_td)["loss"].mean()
    got, td_error, _ = m.td_loss(td.clone())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    if prioritized:  # not TorchRL's self-normalized reduction
        unweighted = reference(td.exclude("priority_weight"))["loss"].detach()
        w = td["priority_weight"]
        assert not torch.allclose(got, (w * unweighted).sum() / w.sum(), rtol=1e-3)
    # TorchRL writes the squared TD error; the priorities are its square root.
    torch.testing.assert_close(td_error, expected_td["td_error"].reshape(-1).sqrt(), rtol=1e-5, atol=1e-5)
    # The gradients agree too (the loss is a function of the online network only).
    got.backward()
    ours = [p.grad.clone() for p in m.online.parameters()]
    m.zero_grad()
    reference(td.clone())["loss"].mean().backward()
    for a, b in zip(ours, [p.grad for p in m.online.parameters()]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("layout", ["torchrl_loss", "q_net"])
def test_checkpoints_of_older_layouts_load(layout: str):
    """State dicts of the versions built on DQNLoss (``loss_module.*`` names) and of those that named the
    networks ``q_net``, ``target_q_net`` and ``eval_q_net`` load into today's module."""
    m = make(eval_polyak=0.5)
    perturb_target(m)
    m.update(batch())
    state = m.state_dict()
    nets = ("online.", "target.", "averaged.")
    old = {k: v for k, v in state.items() if not k.startswith(nets)}
    for k, v in state.items():
        net, _, rest = k.partition(".")
        if layout == "q_net" and k.startswith(nets):
            old[{"online": "q_net.", "target": "target_q_net.", "averaged": "eval_q_net."}[net] + rest] = v
        elif net == "online":
            old["loss_module.value_network_params.module.0.module." + rest] = v
            old["qnet.module.0.module." + rest] = v
        elif net == "target":
            old["loss_module.target_value_network_params.module.0.module." + rest] = v
    if layout == "torchrl_loss":
        old["loss_module._value_estimator.gamma"] = torch.tensor(0.99)
    ckpt = {"state_dict": old}
    fresh = make(eval_polyak=0.5)
    fresh.on_load_checkpoint(ckpt)
    fresh.load_state_dict(ckpt["state_dict"])
    for k, v in state.items():
        # The TorchRL layout had no averaged network: it starts at the online one.
        expected = (
            state["online." + k[len("averaged.") :]]
            if layout == "torchrl_loss" and k.startswith("averaged.")
            else v
        )
        assert torch.equal(fresh.state_dict()[k], expected), k


def test_the_deterministic_policy_acts_with_a_polyak_average_of_the_online_network():
    tau = 0.25
    m = make(eval_polyak=tau)
    averaged = [p.detach().clone() for p in m.averaged.parameters()]
    for seed in range(3):
        m.update(batch(seed))
        averaged = [a + tau * (w - a) for a, w in zip(averaged, online(m))]
    assert all(torch.allclose(a, p, atol=1e-6) for a, p in zip(averaged, m.averaged.parameters()))
    assert all(p.grad is None for p in m.averaged.parameters())
    obs = torch.randn(64, OBS)
    greedy_average = m.averaged(obs).argmax(-1)
    assert not torch.equal(greedy_average, m.online(obs).argmax(-1))  # a policy of its own

    def act_eval(module: DQN) -> torch.Tensor:
        return module.act_eval(TensorDict(observation=obs, batch_size=[64]))["action"]

    assert torch.equal(act_eval(m), greedy_average)
    assert torch.equal(m.export_policy()(obs), greedy_average)
    # The average is part of the state: a checkpoint restores the policy that was evaluated.
    restored = make(eval_polyak=tau)
    restored.load_state_dict(m.state_dict())
    assert torch.equal(
        restored.act_eval(TensorDict(observation=obs, batch_size=[64]))["action"], greedy_average
    )
    # Off by default: evaluation acts with the online network and nothing is averaged.
    plain = make()
    assert plain.averaged is None and not any(k.startswith("averaged.") for k in plain.state_dict())
    with pytest.raises(ValueError, match="eval_polyak"):
        make(eval_polyak=0.0)


def test_a_checkpoint_without_the_average_starts_it_at_the_online_network():
    plain = make()
    plain.update(batch(0))
    checkpoint = {"state_dict": dict(plain.state_dict())}
    averaged = make(eval_polyak=0.01)
    averaged.on_load_checkpoint(checkpoint)
    averaged.load_state_dict(checkpoint["state_dict"])
    for a, w in zip(averaged.averaged.parameters(), plain.online.parameters()):
        assert torch.equal(a, w)


def test_rmsprop_steps_as_the_dqn_papers_centered_rmsprop():
    """``optimizer=rmsprop`` (the MinAtar paper's): two updates move the weights as torch's centered RMSProp
    with momentum 0.95 and eps 0.01 moves them on the same losses; Adam, the default, moves them otherwise."""
    fixed = {"lr": 0.01, "grad_clip": None, "target_update": "hard", "hard_update_every": 100}  # targets held
    m = make(optimizer="rmsprop", **fixed)
    reference = make(optimizer="rmsprop", **fixed)
    by_hand = torch.optim.RMSprop(reference.online.parameters(), lr=0.01, alpha=0.95, eps=0.01, centered=True)
    for seed in (1, 2):
        m.update(batch(seed))
        by_hand.zero_grad()
        reference.td_loss(batch(seed))[0].backward()
        by_hand.step()
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(online(m), online(reference)))
    adam = make(**fixed)
    for seed in (1, 2):
        adam.update(batch(seed))
    assert not all(torch.allclose(a, b, atol=1e-4) for a, b in zip(online(adam), online(m)))
    with pytest.raises(ValueError, match=r"algo\.optimizer='sgd'"):
        make(optimizer="sgd")
