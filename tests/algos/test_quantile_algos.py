"""C51 (and Rainbow), QR-DQN, IQN and AC-IQN: update invariants, hand-computed losses, targets and
risk-sensitive acting (the prioritized-replay reduction and feedback of the discrete members:
``test_value_based.py``)."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from helpers.batches import EPS0, N_ACTIONS, OBS_DIM, discrete_specs, transitions
from helpers.batches import quantile_module as make
from helpers.cli import ReplayedRows
from tensordict import TensorDict
from torch import nn
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.modules import DistributionalQValueActor
from torchrl.objectives import DistributionalDQNLoss

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.algos.quantile import ACIQN, C51, IQN, QRDQN
from rl_lightning.algos.quantile.aciqn import CRITIC_ONLY
from rl_lightning.algos.quantile.math import RISKS, distort, midpoint_fractions, quantile_huber_loss
from rl_lightning.algos.quantile.module import td_discount
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run
from rl_lightning.training.feedback import UpdateFeedback

OBS, ACTIONS, B = OBS_DIM, N_ACTIONS, 16
DISCRETE = ["c51", "rainbow", "qrdqn", "iqn"]


def batch(seed: int = 1, terminated: float = 0.3) -> TensorDict:
    return transitions(B, OBS, ACTIONS, seed, terminated=terminated)


def params(module: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def perturb(module: nn.Module, scale: float = 0.3) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn_like(p))


# ---------------------------------------------------------------------------------------------- every member
@pytest.mark.parametrize("name", DISCRETE)
def test_update_is_finite_and_moves_every_online_parameter(name: str) -> None:
    m = make(name)
    before = params(m.online)
    out = m.update(batch())
    assert set(out.keys()) == {"loss", "grad_norm", "epsilon", "q_mean"}
    assert all(torch.isfinite(v) and v.dim() == 0 for v in out.values())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.online.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, params(m.online)))


@pytest.mark.parametrize("name", DISCRETE)
def test_target_network_is_untouched_by_the_optimizer_step(name: str) -> None:
    m = make(name, target_update="hard", hard_update_every=1000)
    t0 = params(m.target)
    m.update(batch(1))
    m.update(batch(2))
    assert same(t0, params(m.target)) and not same(t0, params(m.online))
    assert all(not p.requires_grad for p in m.target.parameters())


@pytest.mark.parametrize("name", DISCRETE)
def test_soft_target_moves_by_the_polyak_rule_and_hard_target_is_copied_every_k(name: str) -> None:
    tau = 0.1
    m = make(name, target_update="soft", tau=tau)
    t0 = params(m.target)
    m.update(batch())
    for a0, a1, w in zip(t0, params(m.target), params(m.online)):
        torch.testing.assert_close(a1, a0 + tau * (w - a0))
    m = make(name, target_update="hard", hard_update_every=3)
    t0 = params(m.target)
    m.update(batch(1))
    m.update(batch(2))
    assert same(t0, params(m.target))
    m.update(batch(3))
    assert same(params(m.online), params(m.target))


@pytest.mark.parametrize("name", DISCRETE)
def test_greedy_eval_and_epsilon_exploration(name: str) -> None:
    m = make(name, **({} if name == "rainbow" else {"eps_start": 1.0, "eps_end": 1.0}))
    obs = torch.randn(64, OBS)
    greedy = m.act_eval(TensorDict({"observation": obs}, [64]))["action"]
    assert torch.equal(greedy, m.act_eval(TensorDict({"observation": obs}, [64]))["action"])  # deterministic
    torch.testing.assert_close(greedy, m.q_values(obs, explore=False).argmax(-1))
    if name != "rainbow":
        explored = m.act(TensorDict({"observation": obs}, [64]))["action"]
        assert (explored != greedy).any() and explored.min() >= 0 and explored.max() < ACTIONS


def test_rejects_continuous_actions_with_a_clear_message() -> None:
    obs, _ = discrete_specs()
    for cls in (C51, QRDQN, IQN):
        with pytest.raises(IncompatibleEnvError, match="discrete action space"):
            cls(obs, Bounded(-1.0, 1.0, shape=(1, 2)))
    with pytest.raises(IncompatibleEnvError, match="bounded continuous"):
        ACIQN(obs, Categorical(3, shape=(1,)))


def test_n_step_transitions_bootstrap_with_gamma_to_the_steps() -> None:
    td = batch(terminated=0.5)
    td["steps_to_next_obs"] = torch.tensor([1, 2, 3, 3] * (B // 4)).reshape(B, 1)
    reward, discount = td_discount(td, 0.9)
    alive = (~td["next", "terminated"]).float()
    torch.testing.assert_close(discount, 0.9 ** td["steps_to_next_obs"].float() * alive)
    torch.testing.assert_close(reward, td["next", "reward"])
    _, one_step = td_discount(batch(terminated=0.0), 0.9)
    torch.testing.assert_close(one_step, torch.full((B, 1), 0.9))


# --------------------------------------------------------------------------------------- hand-computed losses
@pytest.mark.parametrize("double", [False, True])
def test_qrdqn_loss_matches_a_hand_computed_quantile_regression(double: bool) -> None:
    gamma, kappa = 0.9, 1.0
    m = make("qrdqn", double_dqn=double, gamma=gamma, kappa=kappa)
    perturb(m.target)  # online and target disagree, so the two action rules differ
    td = batch()
    loss, _, _ = m.per_sample_loss(td)
    n = m.hparams.n_quantiles
    tau = [(2 * i + 1) / (2 * n) for i in range(n)]
    with torch.no_grad():
        online, target = m.online(td["observation"]), m.target(td["next", "observation"])
        chooser = m.online(td["next", "observation"]) if double else target
    for b in range(B):
        a_star = int(chooser[b].mean(-1).argmax())
        alive = 0.0 if td["next", "terminated"][b] else 1.0
        y = [float(td["next", "reward"][b]) + gamma * alive * float(target[b, a_star, j]) for j in range(n)]
        theta = online[b, int(td["action"][b])]
        total = 0.0
        for i in range(n):
            for j in range(n):
                u = y[j] - float(theta[i])
                huber = 0.5 * u * u if abs(u) <= kappa else kappa * (abs(u) - 0.5 * kappa)
                total += abs(tau[i] - (1.0 if u < 0 else 0.0)) * huber / kappa / n
        assert abs(float(loss[b]) - total) < 1e-4 * max(1.0, total)


def _torchrl_c51_loss(m: C51, td: TensorDict) -> torch.Tensor:
    """TorchRL's DistributionalDQNLoss on the same network (logits laid out [B, atoms, A] for it)."""

    class Transposed(nn.Module):
        def __init__(self, net: nn.Module) -> None:
            super().__init__()
            self.net = net

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return self.net(obs, False).transpose(-1, -2)

    actor = DistributionalQValueActor(
        Transposed(copy.deepcopy(m.online)), support=m.support.clone(), action_space="categorical"
    )
    loss = DistributionalDQNLoss(actor, gamma=m.hparams.gamma, delay_value=True)
    data = td.clone()
    loss(data)
    return data["td_error"].squeeze(-1)


def test_c51_loss_equals_torchrls_distributional_dqn_loss() -> None:
    # TorchRL's loss always uses double-Q action selection; its target starts equal to the online network.
    m = make("c51", double_dqn=True, gamma=0.9)
    td = batch()
    td["next", "reward"] = 3 * td["next", "reward"]  # some returns beyond the support: clipping matters
    ours, _, _ = m.per_sample_loss(td.clone())
    torch.testing.assert_close(ours, _torchrl_c51_loss(m, td), rtol=1e-5, atol=1e-5)


def test_iqn_loss_matches_a_hand_computed_target_with_the_same_fractions() -> None:
    gamma = 0.9
    m = make("iqn", gamma=gamma, risk="cvar", risk_param=0.5)
    perturb(m.target)
    td = batch()
    hp = m.hparams
    torch.manual_seed(3)
    loss, _, _ = m.per_sample_loss(td)
    torch.manual_seed(3)  # the draws of per_sample_loss, in order: N, K (the target's action), N'
    tau = torch.rand(B, hp.n_quantiles)
    tau_act = torch.rand(B, hp.n_policy_quantiles)
    tau_next = torch.rand(B, hp.n_target_quantiles)
    with torch.no_grad():
        pred = m.online(td["observation"], tau)  # [B, N, A]
        pred = pred[torch.arange(B), :, td["action"]]
        # The next action maximises the target net's CVaR(0.5) estimate: tau scaled by 0.5.
        a_star = m.target(td["next", "observation"], 0.5 * tau_act).mean(1).argmax(-1)
        z_next = m.target(td["next", "observation"], tau_next)[torch.arange(B), :, a_star]
        alive = (~td["next", "terminated"]).float()
        y = td["next", "reward"] + gamma * alive * z_next
    torch.testing.assert_close(loss, quantile_huber_loss(pred, y, tau), rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------------------------------- risk-sensitive acting
class Lottery(nn.Module):
    """Action 0 pays 0 for sure; action 1 pays 10 (tau - 0.3): mean +2, but its lower 30% lose.

    Action 2 is never best. The distorted mean of action 1 is 10 (mean of beta(tau) - 0.3).
    """

    def forward(self, obs: torch.Tensor, tau: torch.Tensor, noisy: bool = True) -> torch.Tensor:
        zero = torch.zeros_like(tau)
        return torch.stack([zero, 10 * (tau - 0.3), zero - 1], -1)


@pytest.mark.parametrize(
    ("risk", "eta", "safe"),
    [
        ("neutral", 0.0, False),
        ("cvar", 0.25, True),
        ("wang", -1.5, True),
        ("pow", -2.0, True),
        ("cpw", 0.71, False),
    ],
)
def test_iqn_acts_on_the_distorted_mean_in_act_and_act_eval(risk: str, eta: float, safe: bool) -> None:
    m = make("iqn", risk=risk, risk_param=eta, n_policy_quantiles=256, **EPS0)
    m.online = Lottery()
    obs = TensorDict({"observation": torch.randn(32, OBS)}, [32])
    expected = torch.zeros(32, dtype=torch.long) if safe else torch.ones(32, dtype=torch.long)
    assert torch.equal(m.act_eval(obs.clone())["action"], expected)
    assert torch.equal(m.act(obs.clone())["action"], expected)
    # act_eval's estimate is the mean over the distorted midpoint grid: deterministic and hand-checkable.
    grid = distort(midpoint_fractions(256), risk, eta)
    q = m.q_values(obs["observation"], explore=False)
    torch.testing.assert_close(q[:, 1], torch.full((32,), float(10 * (grid - 0.3).mean())))


def test_every_distortion_is_accepted_by_iqn() -> None:
    for risk in RISKS:
        m = make("iqn", risk=risk, risk_param=0.5)
        assert m.act_eval(TensorDict({"observation": torch.randn(4, OBS)}, [4]))["action"].shape == (4,)


# ---------------------------------------------------------------------------------------------- AC-IQN
ACT_LOW, ACT_HIGH = -2.0, 2.0


def make_aciqn(**kw) -> ACIQN:
    torch.manual_seed(0)
    obs = Composite(observation=Unbounded((1, OBS)), shape=(1,))
    kw = {"n_quantiles": 8, "n_target_quantiles": 6, "n_policy_quantiles": 5, "n_cos": 16, **kw}
    return ACIQN(obs, Bounded(ACT_LOW, ACT_HIGH, shape=(1, 2)), (32, 32), (32, 32), **kw)


def continuous_batch(seed: int = 1) -> TensorDict:
    td = batch(seed)
    g = torch.Generator().manual_seed(seed + 100)
    td["action"] = ACT_LOW + (ACT_HIGH - ACT_LOW) * torch.rand(B, 2, generator=g)
    return td


def test_aciqn_delays_the_actor_and_the_targets_and_keeps_the_critics_out_of_the_actor_step() -> None:
    m = make_aciqn(policy_delay=2, tau=0.1)
    actor0, critic0 = params(m.actor), params(m.critic)
    targets0 = params(m.actor_target) + params(m.critic_target)
    first = m.prepare_sample(continuous_batch(1))  # update 1 of 2: critic only
    assert CRITIC_ONLY in first.keys() and m.num_updates == 1
    out = m.update(first)
    assert set(out.keys()) == {"loss_qvalue", "loss_actor", "q_mean", "grad_norm"}
    assert all(torch.isfinite(v) and v.dim() == 0 for v in out.values())
    # Critics stepped; the actor and every target untouched; no actor loss yet.
    assert all(not torch.equal(a, b) for a, b in zip(critic0, params(m.critic)))
    assert same(actor0, params(m.actor)) and same(targets0, params(m.actor_target) + params(m.critic_target))
    assert out["loss_actor"] == 0
    critic1 = params(m.critic)
    at1, ct1 = params(m.actor_target), params(m.critic_target)
    second = m.prepare_sample(continuous_batch(2))  # update 2 of 2: critics, actor, Polyak targets
    assert CRITIC_ONLY not in second.keys()
    out = m.update(second)
    assert not same(actor0, params(m.actor)) and out["loss_actor"] != 0
    moved = params(m.actor) + params(m.critic)
    for t0, t1, w in zip(at1 + ct1, params(m.actor_target) + params(m.critic_target), moved):
        torch.testing.assert_close(t1, t0 + 0.1 * (w - t0))
    # The actor step never moves the critics (they are detached in the actor's loss).
    critic2 = params(m.critic)
    m.actor_step(continuous_batch(3))
    assert same(critic2, params(m.critic)) and not same(critic1, critic2)


def test_aciqn_critic_loss_uses_the_smoothed_target_action_and_the_per_fraction_minimum() -> None:
    gamma = 0.9
    m = make_aciqn(gamma=gamma, target_noise=0.3, target_noise_clip=0.4)
    perturb(m.critic_target)
    td = continuous_batch()
    hp = m.hparams
    ref = copy.deepcopy(m)
    torch.manual_seed(5)
    out, _ = m.critic_step(td.clone())
    torch.manual_seed(5)  # draws in order: smoothing noise, N', N
    with torch.no_grad():
        next_a = ref.actor_target(td["next", "observation"])
        next_a = (next_a + (0.3 * torch.randn_like(next_a)).clamp(-0.4, 0.4)).clamp(-1, 1)
        tau_next = torch.rand(B, hp.n_target_quantiles)
        tau = torch.rand(B, hp.n_quantiles)
        x_next = torch.cat([td["next", "observation"], next_a], -1)
        z1, z2 = ref.critic_target(x_next, tau_next).squeeze(-1)  # two critics
        y = td["next", "reward"] + gamma * (~td["next", "terminated"]).float() * torch.minimum(z1, z2)
        action = td["action"] / 2.0  # the env's [-2, 2] scaled to [-1, 1]
        p1, p2 = ref.critic(torch.cat([td["observation"], action], -1), tau).squeeze(-1)
        expected = (quantile_huber_loss(p1, y, tau) + quantile_huber_loss(p2, y, tau)).mean()
    torch.testing.assert_close(out["loss_qvalue"], expected, rtol=1e-5, atol=1e-6)


def test_aciqn_actor_maximises_the_distorted_mean_of_the_first_critic() -> None:
    m = make_aciqn(risk="cvar", risk_param=0.25)
    ref = copy.deepcopy(m)
    td = continuous_batch()
    torch.manual_seed(9)
    loss = m.actor_step(td.clone())
    torch.manual_seed(9)
    with torch.no_grad():
        obs = td["observation"]
        tau = 0.25 * torch.rand(B, m.hparams.n_policy_quantiles)
        z = ref.critic(torch.cat([obs, ref.actor(obs)], -1), tau)[0].squeeze(-1)
    torch.testing.assert_close(loss, -z.mean())


def test_aciqn_acts_within_bounds_and_evaluates_deterministically() -> None:
    m = make_aciqn(exploration_noise=0.5)
    obs = TensorDict({"observation": torch.randn(64, OBS)}, [64])
    a = m.act(obs.clone())["action"]
    assert a.shape == (64, 2) and (a >= ACT_LOW).all() and (a <= ACT_HIGH).all()
    e = m.act_eval(obs.clone())["action"]
    torch.testing.assert_close(e, 2.0 * m.actor(obs["observation"]))
    assert not torch.allclose(a, e) and torch.equal(e, m.act_eval(obs.clone())["action"])


def test_aciqn_update_counter_is_checkpointed() -> None:
    m = make_aciqn()
    for i in range(3):
        m.update(m.prepare_sample(continuous_batch(i)))
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    fresh = make_aciqn()
    fresh.on_load_checkpoint(ckpt)
    assert fresh.num_updates == 3


def test_aciqn_training_step_schedules_every_sample_of_a_round() -> None:
    m = make_aciqn(policy_delay=2)

    class Round:  # the data path's round of samples: iterable, with feedback for each update's output
        def __init__(self) -> None:
            self.fed = []

        def __iter__(self):
            return (continuous_batch(i) for i in range(4))

        def __len__(self) -> int:
            return 4

        def feedback(self, output) -> None:
            self.fed.append(output)

    samples = Round()
    out = m.training_step(samples, 0)
    assert out["updates"] == 4 and len(samples.fed) == 4 and m.num_updates == 4
    # The critics stepped at every update, the actor at the second and the fourth.
    assert {float(s["step"]) for s in m.optimizer(1).state.values()} == {4.0}
    assert {float(s["step"]) for s in m.optimizer(0).state.values()} == {2.0}
    assert m.training_step(continuous_batch(5), 0)["updates"] == 1 and m.num_updates == 5


# --------------------------------------------------------------------------------- through the real data path
#: Small networks: these runs check the wiring of the replay feedback, not learning.
SMALL = {
    "c51_cartpole": ["algo.hidden_sizes=[32,32]"],
    "rainbow_cartpole": ["algo.hidden_sizes=[32,32]"],
    "qrdqn_cartpole": ["algo.hidden_sizes=[32,32]"],
    "iqn_cartpole": ["algo.hidden_sizes=[32,32]", "algo.n_quantiles=8", "algo.n_target_quantiles=8",
                     "algo.n_policy_quantiles=8"],
    "aciqn_pendulum": ["algo.actor_hidden_sizes=[32,32]", "algo.critic_hidden_sizes=[32,32]",
                       "algo.n_quantiles=8", "algo.n_target_quantiles=8", "algo.n_policy_quantiles=8"],
}  # fmt: skip


class LastOutput(L.Callback):
    """Keeps the last update's output and the replay's priorities right after UpdateFeedback applied it."""

    def __init__(self) -> None:
        self.output = None
        self.priorities_after = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # ``training_step`` returns {"metrics": the round's last output, "updates": n}.
        output = outputs["metrics"]
        if output is None:  # a round cut short by the end of the budget
            return
        self.output = output.clone()
        self.priorities_after = trainer.datamodule.replay.sampler._priority.clone()


@pytest.mark.parametrize("experiment", sorted(SMALL))
def test_n_step_and_per_through_the_real_replay_buffer(experiment: str, tmp_path) -> None:
    gamma = 0.9
    cfg = compose(
        [
            f"+experiment={experiment}", "logger=none", "device=cpu", "progress_bar=false",
            "total_frames=600", "collect.frames_per_batch=50", "collect.warmup_frames=250",
            "collect.updates_per_frame=0.25", "eval.every_frames=0", "eval.episodes=1",
            "replay.batch_size=32", "replay.prioritized=true", "replay.alpha=0.7", "replay.n_step=3",
            f"algo.gamma={gamma}", f"run_dir={tmp_path / 'run'}", *SMALL[experiment],
        ]
    )  # fmt: skip
    run = build_run(cfg)
    recorder = LastOutput()
    feedback = next(cb for cb in run.trainer.callbacks if isinstance(cb, UpdateFeedback))
    run.trainer.callbacks.insert(run.trainer.callbacks.index(feedback) + 1, recorder)
    replayed = ReplayedRows(run.datamodule)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    dm = run.datamodule
    assert dm.ingestion.nstep.gamma == gamma and run.module.replay_requirements().discount == gamma
    # n-step: windows of up to 3 steps; a shorter one ends its episode; CartPole's returns are exact.
    stored = replayed.check_stored()  # the replay keeps only the update's keys, unchanged
    steps = stored["steps_to_next_obs"].reshape(-1)
    assert steps.min() >= 1 and steps.max() == 3
    assert stored["next", "done"].reshape(-1)[steps < 3].all()
    if "cartpole" in experiment:
        reward = stored["next", "reward"].reshape(-1)
        torch.testing.assert_close(reward, (1 - gamma ** steps.float()) / (1 - gamma))
    # PER: the replay holds (|priority| + eps) ** alpha for the rows of the last update, and the updates'
    # priorities (per-sample losses) reached many rows.
    sampler = dm.replay.sampler
    index, value = recorder.output["priority", "index"], recorder.output["priority", "value"]
    assert index.shape == value.shape == (32,) and (value > 0).all()
    # A row sampled twice gets one of its two values (IQN's sampled fractions give each draw its own loss).
    expected = (value + sampler.eps) ** 0.7
    stored_p = recorder.priorities_after[index]
    match = (stored_p.unsqueeze(1) - expected.unsqueeze(0)).abs() <= 1e-5 * expected.unsqueeze(0)
    assert (match & (index.unsqueeze(1) == index.unsqueeze(0))).any(1).all()
    assert recorder.priorities_after[: len(dm.replay)].unique().numel() > 20
