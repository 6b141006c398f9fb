"""DQN update invariants: finite losses, gradients, target-network rules, Double DQN targets."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.algos.dqn import DQN

OBS, ACTIONS, B = 4, 3, 32


def specs() -> tuple[Composite, Categorical]:
    return Composite(observation=Unbounded((1, OBS)), shape=(1,)), Categorical(ACTIONS, shape=(1,))


def make(**kw) -> DQN:
    torch.manual_seed(0)
    obs, act = specs()
    return DQN(obs, act, hidden_sizes=(32, 32), **kw)


def batch(seed: int = 1, terminated_frac: float = 0.3) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(B, 1, generator=g) < terminated_frac
    return TensorDict(
        {
            "observation": torch.randn(B, OBS, generator=g),
            "action": torch.randint(0, ACTIONS, (B,), generator=g),
            "next": {
                "observation": torch.randn(B, OBS, generator=g),
                "reward": torch.randn(B, 1, generator=g),
                "terminated": term,
                "truncated": torch.zeros(B, 1, dtype=torch.bool),
                "done": term.clone(),
            },
        },
        batch_size=[B],
    )


def online(m: DQN) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.loss_module.value_network_params.values(True, True)]


def target(m: DQN) -> list[torch.Tensor]:
    return [p.detach().clone() for p in m.loss_module.target_value_network_params.values(True, True)]


def test_update_is_finite_and_moves_every_online_parameter():
    m = make()
    before = online(m)
    metrics = m.update(batch())
    assert torch.isfinite(metrics["loss"]) and metrics["loss"] > 0
    grads = [p.grad for p in m.loss_module.value_network_params.values(True, True)]
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
        with m.loss_module.target_value_network_params.to_module(m.qnet):
            q_next_target = m.q_values(td["next", "observation"])
        if double:
            nxt = q_next_target.gather(-1, q_next_online.argmax(-1, keepdim=True))
        else:
            nxt = q_next_target.max(-1, keepdim=True).values
        y = td["next", "reward"] + gamma * (~td["next", "terminated"]).float() * nxt
        return ((q - y) ** 2).mean()


@pytest.mark.parametrize("double", [False, True])
def test_loss_matches_hand_computed_target(double: bool):
    m = make(double_dqn=double, gamma=0.9)
    with torch.no_grad():  # make target and online differ so the two rules disagree
        for p in m.loss_module.target_value_network_params.values(True, True):
            p.add_(torch.randn_like(p))
    td = batch()
    loss = m.loss_module(td.clone())["loss"]
    assert torch.allclose(loss, _expected_loss(m, td, double, 0.9), rtol=1e-5)


def test_double_dqn_target_differs_from_vanilla_on_crafted_batch():
    vanilla, double = make(double_dqn=False), make(double_dqn=True)
    double.load_state_dict(vanilla.state_dict())
    with torch.no_grad():
        for p in vanilla.loss_module.target_value_network_params.values(True, True):
            p.add_(torch.randn_like(p))
    double.load_state_dict(vanilla.state_dict())
    td = batch(terminated_frac=0.0)
    assert not torch.allclose(vanilla.loss_module(td.clone())["loss"], double.loss_module(td.clone())["loss"])


def test_epsilon_schedule_and_greedy_eval():
    m = make(eps_start=1.0, eps_end=0.1, eps_decay_frames=100)
    assert torch.isclose(m.epsilon(), torch.tensor(1.0))
    m.set_frames(50)
    assert torch.isclose(m.epsilon(), torch.tensor(0.55))
    m.set_frames(1000)
    assert torch.isclose(m.epsilon(), torch.tensor(0.1))
    obs = torch.randn(64, OBS)
    greedy = m.act_eval(TensorDict({"observation": obs}, [64]))["action"]
    assert torch.equal(greedy, m.q_values(obs).argmax(-1))
    m.set_frames(0)  # epsilon 1: actions are uniform, so most differ from greedy somewhere
    explored = m.act(TensorDict({"observation": obs}, [64]))["action"]
    assert (explored != greedy).any() and explored.min() >= 0 and explored.max() < ACTIONS


def test_dueling_head_outputs_value_plus_centred_advantage():
    m = make(dueling=True)
    obs = torch.randn(5, OBS)
    head = m.qnet.module[0].module
    h = head.trunk(obs)
    adv = head.advantage(h)
    assert torch.allclose(m.q_values(obs), head.value(h) + adv - adv.mean(-1, keepdim=True))
    assert m.update(batch())["loss"].isfinite()


def test_rejects_continuous_actions_with_a_clear_message():
    obs, _ = specs()
    with pytest.raises(IncompatibleEnvError, match="discrete action space"):
        DQN(obs, Bounded(-1.0, 1.0, shape=(1, 2)))


def test_prioritized_update_returns_abs_td_errors_of_the_sampled_rows():
    gamma = 0.9
    m = make(gamma=gamma, target_update="hard", hard_update_every=1000)
    with torch.no_grad():
        for p in m.loss_module.target_value_network_params.values(True, True):
            p.add_(0.1 * torch.randn_like(p))
    td = batch()
    td["index"] = torch.arange(100, 100 + B)
    td["priority_weight"] = torch.ones(B)
    with torch.no_grad():
        q = m.q_values(td["observation"]).gather(-1, td["action"].unsqueeze(-1)).squeeze(-1)
        with m.loss_module.target_value_network_params.to_module(m.qnet):
            nxt = m.q_values(td["next", "observation"]).max(-1).values
        y = td["next", "reward"].squeeze(-1) + gamma * (~td["next", "terminated"].squeeze(-1)).float() * nxt
    out = m.update(td)
    assert torch.equal(out["priority", "index"], td["index"])
    torch.testing.assert_close(out["priority", "value"], (q - y).abs(), rtol=1e-5, atol=1e-6)
    # A uniform sample carries no priorities.
    assert "priority" not in m.update(batch(2)).keys()
