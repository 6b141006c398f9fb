"""SAC with options as a module: one option without terminations is SAC (continuous and discrete), acting
carries the option per env and switches only at terminations or episode starts, the replay stores the
option that acted, warm-up rows train no termination, targets move only by Polyak, metrics, export; and
through the CLI: option metrics in MLflow and resume."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from helpers.cli import SMOKE, mlflow_client, mlflow_runs, run_main
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from rl_lightning.algos.options import OPTION_AGE_KEY, OPTION_KEY, SACOptions
from rl_lightning.algos.options import math as om
from rl_lightning.algos.sac import SAC
from rl_lightning.algos.sac_discrete import DiscreteSAC
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run

OBS, ACT, N_ACTIONS, B, K = 3, 2, 4, 64, 4
LOW, HIGH = torch.tensor([-2.0, 0.0]), torch.tensor([2.0, 1.0])
SAC_KEYS = ("loss_qvalue", "loss_actor", "loss_alpha", "alpha", "entropy")


def obs_spec() -> Composite:
    return Composite(observation=Unbounded((1, OBS)), shape=(1,))


def box() -> Bounded:
    return Bounded(LOW.unsqueeze(0), HIGH.unsqueeze(0), shape=(1, ACT))


def make(discrete: bool = False, **kw) -> SACOptions:
    torch.manual_seed(0)
    spec = Categorical(N_ACTIONS, shape=(1,)) if discrete else box()
    kw = {"num_options": K, "hidden_sizes": (32, 32), **kw}
    return SACOptions(obs_spec(), spec, **kw)


def batch(
    seed: int = 1, discrete: bool = False, options: bool = True, terminated: float = 0.3, k: int = K
) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(B, 1, generator=g) < terminated
    if discrete:
        action = torch.randint(0, N_ACTIONS, (B,), generator=g)
    else:
        action = LOW + (HIGH - LOW) * torch.rand(B, ACT, generator=g)
    td = TensorDict(
        {
            "observation": torch.randn(B, OBS, generator=g),
            "action": action,
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
    if options:
        td[OPTION_KEY] = torch.randint(0, k, (B,), generator=g)
        td[OPTION_AGE_KEY] = torch.randint(1, 10, (B,), generator=g)
    return td


# ------------------------------------------------------------------ one option, no terminations: SAC
def sac_critics(sac: SAC | DiscreteSAC) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """SAC's critic and target-critic parameters (each ``[E, ...]``) and its ``log(alpha)``."""
    if isinstance(sac, SAC):
        return list(sac.critic.parameters()), list(sac.target_critic.parameters()), sac.log_alpha
    loss = sac.loss_module
    return (
        list(loss.qvalue_network_params.values(True, True)),
        list(loss.target_qvalue_network_params.values(True, True)),
        loss.log_alpha,
    )


def copy_sac_into(options: SACOptions, sac: SAC | DiscreteSAC) -> None:
    critic, target, _ = sac_critics(sac)
    pairs = [
        (options.actor_net.parameters(), sac.actor_net.parameters()),
        (options.critic.parameters(), critic),
        (options.target_critic.parameters(), target),
    ]
    with torch.no_grad():
        for dst, src in pairs:
            dst, src = list(dst), list(src)
            assert [d.shape for d in dst] == [s.shape for s in src]
            for d, s in zip(dst, src):
                d.copy_(s)


@pytest.mark.parametrize("discrete", [False, True], ids=["sac", "discrete_sac"])
def test_one_option_without_terminations_is_sac(discrete: bool) -> None:
    """Three updates from the same weights and random draws: losses and parameters equal SAC's."""
    torch.manual_seed(0)
    sac = (
        DiscreteSAC(obs_spec(), Categorical(N_ACTIONS, shape=(1,)), hidden_sizes=(32, 32))
        if discrete
        else SAC(obs_spec(), box(), hidden_sizes=(32, 32))
    )
    options = make(discrete, num_options=1, terminations="never")
    copy_sac_into(options, sac)
    sac_entropy = sac.loss_module.target_entropy if discrete else sac.target_entropy
    assert options.target_entropy == pytest.approx(float(sac_entropy))
    for seed in range(3):
        data = batch(seed, discrete, options=seed > 0, k=1)  # also without the option keys (warm-up)
        torch.manual_seed(10 + seed)
        ref = sac.update(data.clone())
        torch.manual_seed(10 + seed)
        out = options.update(data.clone())
        for key in SAC_KEYS:
            torch.testing.assert_close(out[key], ref[key], atol=1e-6, rtol=1e-5)
    critic, target, log_alpha = sac_critics(sac)
    for mine, theirs in [
        (options.actor_net.parameters(), sac.actor_net.parameters()),
        (options.critic.parameters(), critic),
        (options.target_critic.parameters(), target),
        ([options.log_alpha], [log_alpha]),
    ]:
        for a, b in zip(mine, theirs):
            torch.testing.assert_close(a.detach(), b.detach(), atol=1e-6, rtol=1e-5)


# ------------------------------------------------------------------ the update
@pytest.mark.parametrize("discrete", [False, True], ids=["continuous", "discrete"])
def test_update_moves_every_network_and_targets_only_by_polyak(discrete: bool) -> None:
    m = make(discrete, tau=0.25)
    critic0 = [p.detach().clone() for p in m.critic.parameters()]
    target0 = [p.detach().clone() for p in m.target_critic.parameters()]
    others0 = [p.detach().clone() for net in (m.actor_net, m.termination_net) for p in net.parameters()]
    out = m.update(batch(discrete=discrete))
    for t0, c0, t1, c1 in zip(target0, critic0, m.target_critic.parameters(), m.critic.parameters()):
        assert not torch.equal(c0, c1)
        torch.testing.assert_close(t1, t0 + 0.25 * (c1.detach() - t0))
    others1 = [p for net in (m.actor_net, m.termination_net) for p in net.parameters()]
    assert all(not torch.equal(a, b) for a, b in zip(others0, others1))
    assert all(torch.isfinite(v) for v in out.values())
    assert not any(p.requires_grad for p in m.target_critic.parameters())


def test_termination_net_learns_only_from_rows_an_option_acted_in() -> None:
    m = make()
    warmup = batch(options=False)  # no option keys at all
    out = m.update(warmup)
    assert out["loss_termination"] == 0
    assert all(not p.grad.any() for p in m.termination_net.parameters())
    stored_zeros = batch()  # the replay's zero fill for rows written before the keys existed
    stored_zeros[OPTION_AGE_KEY].zero_()
    assert m.update(stored_zeros)["loss_termination"] == 0
    assert m.update(batch(terminated=0.0))["loss_termination"] != 0


def test_termination_step_follows_the_sign_of_advantage_plus_cost() -> None:
    """A huge deliberation cost makes every termination step lower beta where the option acted."""
    for cost, sign in [(1e6, -1.0), (-1e6, 1.0)]:
        m = make(deliberation_cost=cost, termination_lr=1e-2)
        data = batch(terminated=0.0)
        obs = data["next", "observation"]
        before = m._termination_probs(obs).gather(-1, data[OPTION_KEY].unsqueeze(-1))
        m.update(data)
        after = m._termination_probs(obs).gather(-1, data[OPTION_KEY].unsqueeze(-1))
        assert ((after - before).sign() == sign).float().mean() > 0.9


def test_metrics_carry_the_option_figures() -> None:
    m = make(num_envs=8, usage_window=64)
    for _ in range(20):
        m.act(TensorDict({"observation": torch.randn(8, OBS)}, [8]))
    out = m.update(batch())
    usage = torch.stack([out[f"options/usage_{k}"] for k in range(K)])
    torch.testing.assert_close(usage.sum(), torch.tensor(1.0))
    assert out["options/usage_min"] == usage.min()
    assert out["options/duration_mean"] >= 1
    for key in ("options/termination_prob", "options/entropy_high", "options/entropy_low"):
        assert key in out.keys() and out[key].dim() == 0
    assert 0 <= out["options/entropy_high"] <= torch.log(torch.tensor(float(K))) + 1e-5


@pytest.mark.parametrize("discrete", [False, True])
def test_priorities_are_each_rows_td_error_averaged_over_the_options(discrete: bool) -> None:
    """A row's new priority is the mean over the options of the larger critic's ``|Q_e(s, a, w) - y(w)|``,
    with the targets ``y(w) = r + gamma (1 - d) U(s', w)`` of the update itself (the same random draws),
    under the row's own replay index; the importance weights change the loss, not the priorities."""
    m = make(discrete=discrete)
    data = batch(discrete=discrete)
    data["priority_weight"] = torch.rand(B, generator=torch.Generator().manual_seed(4)) + 0.5
    data["index"] = torch.randperm(B, generator=torch.Generator().manual_seed(5)) + 1000
    with torch.no_grad():
        torch.manual_seed(9)  # the update's first draws: the soft values at the next states
        next_obs = data["next", "observation"]
        beta = m._termination_probs(next_obs)
        q_next, _ = m._soft_values(next_obs, m.target_critic, detach=False, alpha=m._alpha())
        v_next = om.option_state_value(q_next, m._option_probs(q_next))
        y = om.critic_targets(
            data["next", "reward"], data["next", "terminated"], m.hparams.gamma,
            om.continuation_value(q_next, v_next, beta),
        )  # fmt: skip
        if discrete:
            q_all = m.critic(data["observation"])  # [E, B, K, n]
            q_pred = torch.stack([q_all[:, b, :, int(data["action"][b])] for b in range(B)], 1)
        else:
            q_pred = m.critic(data["observation"], m.actions.from_env(data["action"]))  # [E, B, K]
    expected = [
        sum(max(abs(q_pred[e, b, w] - y[b, w]).item() for e in range(q_pred.shape[0])) for w in range(K)) / K
        for b in range(B)
    ]
    torch.manual_seed(9)
    out = m.update(data)
    assert torch.equal(out["priority", "index"], data["index"])
    torch.testing.assert_close(out["priority", "value"], torch.tensor(expected), rtol=1e-5, atol=1e-6)


def test_rejects_bad_arguments_and_export() -> None:
    with pytest.raises(ValueError, match="option_policy"):
        make(option_policy="greedy")
    with pytest.raises(ValueError, match="terminations"):
        make(terminations="sometimes")
    with pytest.raises(NotImplementedError, match="per-env state"):
        make().export_policy()


# ------------------------------------------------------------------ acting
def step_td(n: int, step_count: torch.Tensor | None = None, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    td = TensorDict({"observation": torch.randn(n, OBS, generator=g)}, [n])
    if step_count is not None:
        td["step_count"] = step_count.reshape(n, 1)
    return td


def force_beta(m: SACOptions, prob: float) -> None:
    last = m.termination_net.net[-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.fill_(float(torch.logit(torch.tensor(prob))) if 0 < prob < 1 else (30.0 if prob else -30.0))


@pytest.mark.parametrize("discrete", [False, True], ids=["continuous", "discrete"])
def test_act_writes_the_option_per_env_and_switches_only_at_episode_starts_without_terminations(
    discrete: bool,
) -> None:
    n, m = 16, make(discrete, num_envs=16)
    force_beta(m, 0.0)
    steps = torch.zeros(n, dtype=torch.int64)
    prev = None
    for t in range(60):
        td = m.act(step_td(n, steps, seed=t))
        option, age = td[OPTION_KEY], td[OPTION_AGE_KEY]
        assert option.shape == age.shape == (n,) and option.dtype == torch.int64
        start = steps == 0
        assert torch.equal(age == 1, start)
        if prev is not None:
            assert torch.equal(option[~start], prev[~start])
        action = td["action"]
        if discrete:
            assert action.shape == (n,) and ((action >= 0) & (action < N_ACTIONS)).all()
        else:
            assert action.shape == (n, ACT) and ((action >= LOW) & (action <= HIGH)).all()
        prev = option.clone()
        # Envs end episodes at different times (every 7 + i steps).
        steps = torch.where(steps + 1 >= 7 + torch.arange(n), 0, steps + 1)
    assert prev.unique().numel() > 1  # new episodes drew different options


def test_act_with_certain_terminations_chooses_every_step_and_usage_follows() -> None:
    m = make(num_envs=64)
    force_beta(m, 1.0)
    for t in range(10):
        td = m.act(step_td(64, seed=t))
        assert (td[OPTION_AGE_KEY] == 1).all()
    summary = m.usage.summary()
    assert summary["options/duration_mean"] == 1.0
    assert summary["options/usage_min"] > 0.1  # near-equal option values: every option is drawn


def test_act_terminations_come_at_rate_beta() -> None:
    m = make(num_envs=512)
    force_beta(m, 0.2)
    m.act(step_td(512))  # every env starts an option
    starts = torch.stack([m.act(step_td(512, seed=t))[OPTION_AGE_KEY] == 1 for t in range(1, 6)])
    assert abs(starts.float().mean().item() - 0.2) < 0.03


def test_act_checks_the_number_of_envs_and_act_eval_takes_any_number() -> None:
    m = make(num_envs=4)
    with pytest.raises(ValueError, match="num_envs"):
        m.act(step_td(5))
    for n in (1, 7):
        a = m.act_eval(step_td(n, torch.zeros(n, dtype=torch.int64)))["action"]
        assert a.shape == (n, ACT)


def test_act_eval_is_deterministic_greedy_and_keeps_its_option_until_beta_exceeds_a_half() -> None:
    m = make()
    force_beta(m, 0.0)
    n = 6

    def episode() -> tuple[list, list]:
        options, actions = [], []
        for t in range(12):
            td = m.act_eval(step_td(n, torch.full((n,), t), seed=t))
            options.append(td[OPTION_KEY].clone())
            actions.append(td["action"].clone())
        return options, actions

    (o1, a1), (o2, a2) = episode(), episode()
    assert all(torch.equal(x, y) for x, y in zip(o1 + a1, o2 + a2))
    assert all(torch.equal(o, o1[0]) for o in o1)  # beta = 0: the first greedy option all episode
    loc, _ = m.actor_net(step_td(n)["observation"])
    q = m.critic(m._expand(step_td(n)["observation"]), torch.tanh(loc)).diagonal(dim1=-2, dim2=-1).min(0)[0]
    assert torch.equal(o1[0], q.argmax(-1))
    force_beta(m, 1.0)  # beta = 1: the greedy option of each state
    for t in range(3):
        td = m.act_eval(step_td(n, torch.full((n,), t + 1), seed=t))
        assert (td[OPTION_AGE_KEY] == 1).all()


# ------------------------------------------------------------------ through the real data path
class ActRecorder(L.Callback):
    """Records what ``act`` wrote during the fit (wraps it at fit start, after the module is placed)."""

    def __init__(self) -> None:
        self.options: list[torch.Tensor] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        act = pl_module.act

        def recording(td):
            out = act(td)
            self.options.append(out[OPTION_KEY].clone())
            return out

        pl_module.act = recording


def test_the_replay_stores_the_option_that_acted(tmp_path: Path) -> None:
    cfg = compose(
        [
            "+experiment=sac_options_pendulum", "logger=none", "device=cpu", "progress_bar=false",
            "total_frames=300", "env.num_envs=2", "collect.frames_per_batch=10", "collect.warmup_frames=100",
            "collect.updates_per_frame=0.1", "replay.batch_size=16", "algo.hidden_sizes=[16,16]",
            "eval.every_frames=0", "eval.episodes=1", "env.eval_num_envs=1", f"run_dir={tmp_path / 'run'}",
        ]
    )  # fmt: skip
    run = build_run(cfg)
    recorder = ActRecorder()
    run.trainer.callbacks.append(recorder)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    stored = run.datamodule.replay.storage[: len(run.datamodule.replay)]
    assert len(stored) == 300
    # TorchRL's collector calls the policy once when it is built, to find its output keys: not a step.
    acted = torch.stack(recorder.options[1:])  # [steps after warm-up, 2 envs]
    # Interleaved storage: each collection of 5 steps of 2 envs is stored env by env, so undo that.
    replayed = stored[OPTION_KEY][100:].reshape(-1, 2, 5).transpose(1, 2).reshape(-1, 2)
    assert torch.equal(replayed, acted)
    assert (stored[OPTION_AGE_KEY][:100] == 0).all() and (stored[OPTION_AGE_KEY][100:] >= 1).all()


# ------------------------------------------------------------------ through the CLI
@pytest.mark.slow
def test_fit_logs_option_metrics_in_mlflow_and_resumes(tmp_path: Path) -> None:
    args = (
        "fit", "+experiment=sac_options_pendulum", "device=cpu", *SMOKE, "log_every_n_updates=10",
        "algo.hidden_sizes=[32,32]", "replay.batch_size=32", "collect.frames_per_batch=20",
        "collect.warmup_frames=100", "collect.updates_per_frame=0.5", "checkpoint.every_frames=100",
        "env.eval_num_envs=2",
    )  # fmt: skip
    first = run_main(tmp_path, *args, "total_frames=300")
    assert first.returncode == 0, first.stderr[-3000:]
    (last,) = tmp_path.glob("runs/sac_options_pendulum/*/checkpoints/last.ckpt")
    saved = torch.load(last, weights_only=True)
    second = run_main(tmp_path, *args, "total_frames=500", "ckpt_path=last")
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = torch.load(last, weights_only=True)
    dm0, dm1 = (next(v for k, v in c.items() if k.endswith("RLDataModule")) for c in (saved, resumed))
    assert dm0["frames"] == 300 and dm1["frames"] == 500
    # All four optimizers came back and carried on to the data path's update count.
    for opt in resumed["optimizer_states"]:
        assert all(float(s["step"]) == dm1["updates"] for s in opt["state"].values())
    # The usage window came back too: it holds the acting steps of both parts of the run, and nothing of
    # the collector's probe of the policy when each part starts (data.collection.unobserved).
    assert resumed["state_dict"]["usage.count"] == 500 - 100
    (run,) = mlflow_runs(tmp_path)
    client = mlflow_client(tmp_path)
    for key in ("options/usage_min", "options/duration_mean", "options/termination_prob", "train/alpha"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert steps and any(s > 300 for s in steps), key
    assert not any(k.startswith("train/options/") for k in run.data.metrics)
