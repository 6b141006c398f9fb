"""TD3 and DDPG update invariants: hand-computed targets (clipped smoothing noise, clipped double Q,
n-step discount), the delayed actor and target schedule, Polyak targets, acting and PER feedback; and
prioritized n-step replay through the real data path."""

from __future__ import annotations

import pytest
import torch
from helpers.batches import box, transitions
from helpers.fit import check_per_and_n_step, fit_with_per_and_n_step
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.algos.td3 import CRITIC_ONLY, DDPG, TD3

OBS, ACT, B = 3, 2, 64
LOW, HIGH = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])


def specs() -> tuple[Composite, Bounded]:
    obs = Composite(observation=Unbounded((1, OBS)), shape=(1,))
    return obs, Bounded(LOW.unsqueeze(0), HIGH.unsqueeze(0), shape=(1, ACT))


def make(cls=TD3, **kw):
    torch.manual_seed(0)
    return cls(*specs(), hidden_sizes=(32, 32), **kw)


def batch(seed: int = 1, terminated: float = 0.3) -> TensorDict:
    return transitions(B, OBS, box(LOW, HIGH), seed, terminated=terminated)


def leaves(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params.values(True, True)]


def critic_params(m):
    return m.loss_module.qvalue_network_params if isinstance(m, TD3) else m.loss_module.value_network_params


def target_critic_params(m):
    loss = m.loss_module
    return loss.target_qvalue_network_params if isinstance(m, TD3) else loss.target_value_network_params


def critic_values(m, params, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``[K, B]``: each of the ``K`` critics of ``params`` (stacked for TD3) at ``(obs, action)``."""
    loss = m.loss_module
    net = loss.qvalue_network if isinstance(m, TD3) else loss.value_network
    stacked = params if isinstance(m, TD3) else params.unsqueeze(0)
    out = []
    with torch.no_grad():
        for k in range(stacked.shape[0]):
            with stacked[k].to_module(net):
                td = TensorDict({"observation": obs, "action": action}, [obs.shape[0]])
                out.append(net(td)["state_action_value"].squeeze(-1))
    return torch.stack(out)


def target_actor(m, obs: torch.Tensor) -> torch.Tensor:
    loss = m.loss_module
    with torch.no_grad(), loss.target_actor_network_params.to_module(loss.actor_network):
        return loss.actor_network(TensorDict({"observation": obs}, [obs.shape[0]]))["action"]


def hand_target(m, td: TensorDict, noise: float, gamma: float) -> torch.Tensor:
    """``r + gamma^steps (1 - terminated) min_k Q'_k(s', clamp(mu'(s') + noise, -1, 1))``."""
    nxt = td["next", "observation"]
    action = (target_actor(m, nxt) + noise).clamp(-1.0, 1.0)
    q_next = critic_values(m, target_critic_params(m), nxt, action).min(0).values
    steps = td.get("steps_to_next_obs", torch.ones(B, 1)).squeeze(-1)
    alive = (~td["next", "terminated"]).float().squeeze(-1)
    return td["next", "reward"].squeeze(-1) + gamma**steps * alive * q_next


def scaled(td: TensorDict) -> torch.Tensor:
    return (2 * (td["action"] - LOW) / (HIGH - LOW) - 1).clamp(-1, 1)


def randomize_targets(m) -> None:
    with torch.no_grad():
        for params in (target_critic_params(m), m.loss_module.target_actor_network_params):
            for p in params.values(True, True):
                p.add_(0.1 * torch.randn_like(p))


@pytest.mark.parametrize("steps", [1, 3])
def test_td3_critic_loss_uses_clipped_smoothing_noise_and_the_smaller_target_critic(monkeypatch, steps):
    gamma, clip = 0.9, 0.3
    m = make(gamma=gamma, target_noise=5.0, noise_clip=clip)
    randomize_targets(m)
    td = batch()
    td["steps_to_next_obs"] = torch.full((B, 1), steps)
    # Gaussian draws of +10: the smoothing noise is 10 * 5.0 before the clip, exactly +clip after it.
    monkeypatch.setattr(torch, "randn_like", lambda x, **kw: torch.full_like(x, 10.0))
    loss, meta = m.loss_module.value_loss(m._loss_input(td))
    y = hand_target(m, td, clip, gamma)
    q = critic_values(m, critic_params(m), td["observation"], scaled(td))
    torch.testing.assert_close(loss, ((q - y) ** 2).mean(-1).sum())  # MSE summed over the two critics
    torch.testing.assert_close(meta["td_error"], (q - y) ** 2)


def test_ddpg_critic_loss_is_the_mse_to_the_target_actor_critic_value():
    gamma = 0.95
    m = make(DDPG, gamma=gamma)
    randomize_targets(m)
    td = batch()
    td["steps_to_next_obs"] = torch.randint(1, 4, (B, 1))
    loss, _ = m.loss_module.loss_value(m._loss_input(td))
    y = hand_target(m, td, 0.0, gamma)
    q = critic_values(m, critic_params(m), td["observation"], scaled(td))[0]
    torch.testing.assert_close(loss, ((q - y) ** 2).mean())


@pytest.mark.parametrize(("cls", "delay"), [(TD3, 3), (DDPG, 1)])
def test_actor_and_targets_move_only_every_policy_delay_updates_and_by_polyak(cls, delay):
    tau = 0.2
    m = make(cls, tau=tau, policy_delay=delay) if cls is TD3 else make(cls, tau=tau)
    randomize_targets(m)
    loss = m.loss_module
    for i in range(1, 2 * delay + 1):
        actor0, critic0 = leaves(loss.actor_network_params), leaves(critic_params(m))
        targets0 = leaves(loss.target_actor_network_params) + leaves(target_critic_params(m))
        out = m.update(m.prepare_sample(batch(i)))
        assert set(out.keys()) == {"loss_qvalue", "loss_actor", "q_mean"}
        actor1, critic1 = leaves(loss.actor_network_params), leaves(critic_params(m))
        targets1 = leaves(loss.target_actor_network_params) + leaves(target_critic_params(m))
        assert all(not torch.equal(a, b) for a, b in zip(critic0, critic1))  # the critic, every update
        if i % delay:
            assert all(torch.equal(a, b) for a, b in zip(actor0, actor1))
            assert all(torch.equal(a, b) for a, b in zip(targets0, targets1))
        else:
            assert all(not torch.equal(a, b) for a, b in zip(actor0, actor1))
            for t0, t1, w in zip(targets0, targets1, actor1 + critic1):
                torch.testing.assert_close(t1, t0 + tau * (w - t0), rtol=1e-5, atol=1e-6)
    assert m.num_updates == 2 * delay


def test_schedule_marks_critic_only_batches_on_the_host_and_checkpoints_its_counter():
    m = make(policy_delay=2)
    td = batch()
    marked = m.prepare_sample(td)
    assert CRITIC_ONLY in marked.keys() and CRITIC_ONLY not in td.keys()
    assert marked[CRITIC_ONLY].shape == (B, 0)
    assert m.prepare_sample(td) is td  # the second update steps the actor
    checkpoint: dict = {}
    m.on_save_checkpoint(checkpoint)
    other = make(policy_delay=2)
    other.on_load_checkpoint(checkpoint)
    assert other.num_updates == 2 and CRITIC_ONLY in other.prepare_sample(td).keys()


def test_training_step_schedules_every_sample_of_a_round():
    m = make(policy_delay=3)
    m.training_step(batch(1), 0)  # one sample: scheduled once
    assert m.num_updates == 1

    class Round:  # the data path's round of samples: iterable, with feedback for each update's output
        def __init__(self) -> None:
            self.fed = []

        def __iter__(self):
            return (batch(i) for i in range(5))

        def __len__(self) -> int:
            return 5

        def feedback(self, output) -> None:
            self.fed.append(output)

    seen = []
    update = m.update
    m.update = lambda sample: seen.append(CRITIC_ONLY in sample.keys()) or update(sample)
    samples = Round()
    out = m.training_step(samples, 1)
    assert seen == [True, False, True, True, False] and m.num_updates == 6  # updates 2..6: 3 and 6 step
    assert out["updates"] == 5 and len(samples.fed) == 5  # every update's output went back to the round


def test_critic_only_update_reports_the_last_actor_loss():
    m = make()
    full = m.update(batch(1))
    before = leaves(m.loss_module.actor_network_params)
    critic_only = m.update(m.prepare_sample(batch(2)))
    assert all(torch.equal(a, b) for a, b in zip(before, leaves(m.loss_module.actor_network_params)))
    assert torch.equal(critic_only["loss_actor"], full["loss_actor"])
    assert not torch.equal(critic_only["loss_qvalue"], full["loss_qvalue"])


@pytest.mark.parametrize("cls", [TD3, DDPG])
def test_actor_step_raises_the_critics_value_of_its_actions(cls):
    m = make(cls, actor_lr=1e-2, critic_lr=0.0)
    td = batch()

    def value() -> torch.Tensor:
        action = m.actor_net(td["observation"]).detach()
        return critic_values(m, critic_params(m), td["observation"], action)[0].mean()

    before = value()
    for _ in range(5):
        m.update(td)
    assert value() > before


@pytest.mark.parametrize("cls", [TD3, DDPG])
def test_act_adds_bounded_noise_and_eval_is_the_actor(cls):
    m = make(cls, exploration_noise=0.3)
    obs = TensorDict({"observation": torch.randn(16, OBS)}, [16])
    a1, a2 = m.act(obs.clone())["action"], m.act(obs.clone())["action"]
    assert a1.shape == (16, ACT) and not torch.equal(a1, a2)
    assert ((a1 >= LOW) & (a1 <= HIGH)).all()
    e = m.act_eval(obs.clone())["action"]
    assert torch.equal(e, m.act_eval(obs.clone())["action"])
    torch.testing.assert_close(e, (LOW + HIGH) / 2 + (HIGH - LOW) / 2 * m.actor_net(obs["observation"]))
    quiet = make(cls, exploration_noise=0.0)
    assert torch.equal(quiet.act(obs.clone())["action"], quiet.act_eval(obs.clone())["action"])


@pytest.mark.parametrize("cls", [TD3, DDPG])
def test_prioritized_update_returns_abs_td_errors(monkeypatch, cls):
    m = make(cls)
    td = batch()
    td["index"] = torch.arange(B)
    td["priority_weight"] = torch.ones(B)
    monkeypatch.setattr(torch, "randn_like", torch.zeros_like)  # no smoothing, no exploration noise
    y = hand_target(m, td, 0.0, 0.99)
    expected = (critic_values(m, critic_params(m), td["observation"], scaled(td)) - y).abs().amax(0)
    out = m.update(td)
    torch.testing.assert_close(out["priority", "value"], expected)
    assert torch.equal(out["priority", "index"], td["index"])


def test_grad_clipping_reports_both_norms_on_every_update():
    m = make(grad_clip=0.5)
    assert {"grad_norm_qvalue", "grad_norm_actor"} <= set(m.update(batch(1)).keys())
    assert {"grad_norm_qvalue", "grad_norm_actor"} <= set(m.update(m.prepare_sample(batch(2))).keys())


def test_rejects_discrete_actions_and_bad_values():
    obs, _ = specs()
    with pytest.raises(IncompatibleEnvError, match="bounded continuous"):
        TD3(obs, Categorical(3, shape=(1,)))
    with pytest.raises(ValueError, match="policy_delay"):
        make(policy_delay=0)


@pytest.mark.parametrize("experiment", ["td3_pendulum", "ddpg_pendulum"])
def test_per_and_n_step_through_the_real_replay(tmp_path, experiment: str) -> None:
    run, recorder = fit_with_per_and_n_step(tmp_path, experiment)
    check_per_and_n_step(run, recorder)
