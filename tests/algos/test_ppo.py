"""PPO's parts against hand computations: GAE with truncation and termination, the clipped losses, the
policy's log-probabilities, the annealing, and one update that moves the policy the advantage's way."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rl_lightning.algos.ppo import PPO, gae, ppo_losses


def specs(discrete: bool, obs_dim: int = 3, n: int = 2):
    obs = Composite(observation=Unbounded((n, obs_dim)), shape=(n,))
    if discrete:
        return obs, Categorical(4, shape=(n,), dtype=torch.int64)
    return obs, Bounded(low=-2.0, high=2.0, shape=(n, 2))


def test_gae_cuts_the_trace_at_episode_ends_and_bootstraps_only_truncations() -> None:
    gamma, lmbda = 0.9, 0.8
    reward = torch.tensor([[1.0, 2.0, 0.5, -1.0, 3.0]])
    value = torch.tensor([[0.3, -0.2, 0.7, 0.1, 0.4]])
    next_value = torch.tensor([[0.5, 9.0, 0.2, 7.0, 0.6]])  # 9.0: a truncated episode's last observation
    truncated = torch.tensor([[False, True, False, False, False]])
    terminated = torch.tensor([[False, False, False, True, False]])
    done = truncated | terminated
    advantage, returns = gae(reward, value, next_value, terminated, done, gamma, lmbda)

    expected, following = [0.0] * 5, 0.0
    for t in reversed(range(5)):
        bootstrap = 0.0 if terminated[0, t] else gamma * next_value[0, t].item()
        delta = reward[0, t].item() + bootstrap - value[0, t].item()
        following = delta + (0.0 if done[0, t] else gamma * lmbda * following)
        expected[t] = following
    assert advantage[0].tolist() == pytest.approx(expected, abs=1e-6)
    with_value = [a + v for a, v in zip(expected, value[0].tolist())]
    assert returns[0].tolist() == pytest.approx(with_value, abs=1e-6)
    # The truncated step bootstraps from its last observation; the terminated step does not.
    assert advantage[0, 1].item() == pytest.approx(2.0 + 0.9 * 9.0 + 0.2, abs=1e-6)
    assert advantage[0, 3].item() == pytest.approx(-1.0 - 0.1, abs=1e-6)


def test_clipped_losses_match_a_hand_computation() -> None:
    old = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    new = old + torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))  # ratios
    adv = torch.tensor([1.0, 1.0, -2.0, -2.0])
    value, old_value = torch.tensor([1.0, 0.0, 2.0, -1.0]), torch.zeros(4)
    ret = torch.tensor([0.5, 1.0, 1.0, 0.0])
    out = ppo_losses(new, old, adv, value, old_value, ret, 0.2, clip_value_loss=True)
    # max(-A r, -A clip(r)): r=1.5, A=1 -> -1.2; r=0.5, A=1 -> -0.5; r=1.1, A=-2 -> 2.2; r=0.7, A=-2 -> 1.6
    assert out["loss_policy"].item() == pytest.approx((-1.2 - 0.5 + 2.2 + 1.6) / 4)
    # Clipped values 0.2, 0, 0.2, -0.2: max((V-R)^2, (Vc-R)^2) = 0.25, 1, 1, 1 (the larger of each pair)
    assert out["loss_value"].item() == pytest.approx(0.5 * (0.25 + 1.0 + max(1.0, 0.64) + max(1.0, 0.04)) / 4)
    unclipped = ppo_losses(new, old, adv, value, old_value, ret, 0.2, clip_value_loss=False)
    assert unclipped["loss_value"].item() == pytest.approx(0.5 * (0.25 + 1.0 + 1.0 + 1.0) / 4)
    r = torch.tensor([1.5, 0.5, 1.1, 0.7])
    assert out["approx_kl"].item() == pytest.approx(((r - 1) - r.log()).mean().item(), abs=1e-6)
    assert out["clip_fraction"].item() == pytest.approx(3 / 4)  # 1.5, 0.5 and 0.7 leave [0.8, 1.2]


@pytest.mark.parametrize(
    ("discrete", "kwargs"),
    [
        (True, {}),
        (False, {"action_squash": "clip"}),
        (False, {"action_squash": "tanh"}),
        (False, {"log_std": "state_dependent", "log_std_init": -0.5}),
    ],
)
def test_act_stores_the_log_probability_the_update_reads(discrete: bool, kwargs: dict) -> None:
    torch.manual_seed(0)
    module = PPO(*specs(discrete), **kwargs)
    td = module.act(TensorDict({"observation": torch.randn(5, 3)}, batch_size=[5]))
    sample = td["action"] if discrete else td["raw_action"]
    log_prob, _ = module._log_prob_entropy(*module._distribution(td["observation"]), sample)
    torch.testing.assert_close(td["log_prob"], log_prob)
    if not discrete:
        action = td["action"]
        assert action.shape == (5, 2) and (action.abs() <= 2.0).all()
        squash = torch.tanh if kwargs.get("action_squash") == "tanh" else lambda u: u.clamp(-1, 1)
        torch.testing.assert_close(action, 2.0 * squash(td["raw_action"]))
    if kwargs.get("action_squash") == "tanh":  # change of variables: the density of a = tanh(u)
        loc, scale = module._distribution(td["observation"])
        u = td["raw_action"]
        gaussian = torch.distributions.Normal(loc, scale).log_prob(u).sum(-1)
        torch.testing.assert_close(log_prob, gaussian - torch.log(1 - torch.tanh(u) ** 2).sum(-1))
    if kwargs.get("log_std") == "state_dependent":
        _, scale = module._distribution(td["observation"])
        torch.testing.assert_close(scale, torch.full_like(scale, math.exp(-0.5)), atol=0.05, rtol=0)


def rollout_of(module: PPO, n: int = 2, t: int = 8) -> TensorDict:
    obs = torch.randn(n, t, 3)
    td = module.act(TensorDict({"observation": obs.reshape(n * t, 3)}, batch_size=[n * t])).reshape(n, t)
    td["next"] = TensorDict(
        {
            "observation": torch.randn(n, t, 3),
            "reward": torch.randn(n, t, 1),
            "terminated": torch.zeros(n, t, 1, dtype=torch.bool),
            "done": torch.zeros(n, t, 1, dtype=torch.bool),
        },
        batch_size=[n, t],
    )
    return td


@pytest.mark.parametrize("discrete", [True, False])
def test_an_update_raises_the_probability_of_actions_with_a_positive_advantage(discrete: bool) -> None:
    torch.manual_seed(1)
    module = PPO(*specs(discrete), lr=1e-2, entropy_coef=0.0, normalize_advantages=False)
    rollout = rollout_of(module)
    module.prepare_rollout(rollout)
    assert set(rollout.keys()) >= {"state_value", "advantage", "value_target"}
    value, target = rollout["state_value"], rollout["value_target"]
    explained = 1 - (target - value).var() / target.var()
    torch.testing.assert_close(module.explained_variance, explained)
    batch = rollout.reshape(-1)
    batch["advantage"] = torch.where(torch.arange(16) < 8, 1.0, -1.0)
    before = batch["log_prob"].clone()
    for _ in range(5):
        out = module.update(batch)
    sample = batch["action"] if discrete else batch["raw_action"]
    after, _ = module._log_prob_entropy(*module._distribution(batch["observation"]), sample)
    assert (after[:8] - before[:8]).mean() > 0 > (after[8:] - before[8:]).mean()
    assert set(out.keys()) >= {"loss", "loss_policy", "loss_value", "entropy", "approx_kl", "clip_fraction"}
    assert out["explained_variance"] == explained


@pytest.mark.parametrize("discrete", [True, False])
def test_without_an_entropy_bonus_the_entropy_stays_out_of_the_backward_with_the_same_steps(
    discrete: bool,
) -> None:
    def trained(entropy_in_graph: bool) -> tuple[PPO, list[torch.Tensor]]:
        torch.manual_seed(2)
        module = PPO(*specs(discrete), lr=1e-2, entropy_coef=0.0)
        if entropy_in_graph:  # the update as it was: the entropy's zero-weighted term in the backward
            plain = module._log_prob_entropy
            module._log_prob_entropy = lambda first, scale, sample, entropy_grad=True: plain(
                first, scale, sample
            )
        rollout = rollout_of(module)
        module.prepare_rollout(rollout)
        for _ in range(4):
            module.update(rollout.reshape(-1))
        return module, [p.detach().clone() for p in module.parameters()]

    module, params = trained(entropy_in_graph=False)
    _, reference = trained(entropy_in_graph=True)
    assert all(torch.equal(a, b) for a, b in zip(params, reference, strict=True))
    batch = rollout_of(module)
    module.prepare_rollout(batch)
    assert not module.losses(batch.reshape(-1))["entropy"].requires_grad
    module.hparams.entropy_coef = 0.01  # a bonus: the entropy's gradient counts
    assert module.losses(batch.reshape(-1))["entropy"].requires_grad


def test_the_learning_rate_and_the_clipping_range_anneal_over_the_frames() -> None:
    module = PPO(*specs(True), lr=1e-3, anneal_frames=1000, anneal_clip=True, clip_coef=0.2)
    opt = module.optimizer()
    module.set_frames(250)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.75e-3)
    assert module.clip_schedule.value.item() == pytest.approx(0.15)
    module.set_frames(2000)
    assert opt.param_groups[0]["lr"] == 0.0
    fixed = PPO(*specs(True), lr=1e-3, anneal_lr=False, anneal_frames=1000)
    fixed.set_frames(500)
    assert fixed.optimizer().param_groups[0]["lr"] == pytest.approx(1e-3)
    assert fixed.clip_schedule.value.item() == pytest.approx(0.2)


def test_bad_settings_are_refused_with_the_key_to_change() -> None:
    with pytest.raises(ValueError, match=r"algo\.action_squash"):
        PPO(*specs(False), action_squash="sigmoid")
    with pytest.raises(ValueError, match=r"algo\.target_kl"):
        PPO(*specs(True), target_kl=0.0)


def test_shared_layers_sit_between_the_encoder_and_both_heads_and_learn_from_both_losses() -> None:
    # CleanRL's Atari agent: one ReLU layer of 512 shared by actor and critic, linear heads.
    torch.manual_seed(0)
    module = PPO(*specs(True), hidden_sizes=[], shared_hidden_sizes=[8])
    shared = module.actor.encoder
    assert module.critic.encoder is shared
    assert [type(m) for m in shared] == [torch.nn.Linear, torch.nn.ReLU] and shared[0].out_features == 8
    assert module.actor.head[-1].in_features == 8 and module.critic.head[-1].in_features == 8
    obs = torch.randn(5, 3)
    torch.testing.assert_close(module.critic(obs), module.critic.head(torch.relu(shared[0](obs))))
    module.critic(obs).sum().backward()
    assert shared[0].weight.grad is not None and shared[0].weight.grad.abs().sum() > 0
    # Without shared layers a vector observation's networks stay plain MLPs (their parameter names too).
    assert not hasattr(PPO(*specs(True)).actor, "encoder")
