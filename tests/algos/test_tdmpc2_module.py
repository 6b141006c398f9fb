"""TD-MPC2 as a LightningModule: update invariants, acting, warm starts, checkpoints, CLI smoke runs."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest
import torch
from helpers.cli import TINY_TDMPC2, run_main
from omegaconf import OmegaConf
from tensordict import TensorDict

from rl_lightning.algos.tdmpc2 import TDMPC2
from rl_lightning.algos.tdmpc2.module import parse_model_size
from rl_lightning.cli.run import build_module, env_config
from rl_lightning.envs.factory import EnvConfig, make_env
from rl_lightning.training.evaluation import evaluate_policy
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

TINY = {"latent_dim": 32, "mlp_dim": 32, "enc_dim": 32}
TINY_PLAN = {"num_samples": 32, "num_elites": 4, "num_pi_trajs": 4, "iterations": 2}
H = 3


@pytest.fixture(autouse=True)
def one_thread():
    # Two OpenMP threads on a shared 2-core machine wait on each other; one is faster and steadier.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def specs(env_id: str = "Pendulum-v1"):
    env = make_env(EnvConfig(id=env_id), num_envs=1)
    try:
        return env.full_observation_spec.clone(), env.full_action_spec["action"].clone()
    finally:
        env.close()


def make_module(env_id: str = "Pendulum-v1", seed: int = 0, **kwargs) -> TDMPC2:
    torch.manual_seed(seed)
    obs_spec, act_spec = specs(env_id)
    args = {"model_size": "1M", "episode_length": 200, **TINY, **TINY_PLAN, **kwargs}
    module = TDMPC2(obs_spec, act_spec, **args)
    # Outside a Trainer: hand the optimizers and the backward call to the module directly.
    opts = module.configure_optimizers()
    module.optimizers = lambda: opts
    module.manual_backward = lambda loss: loss.backward()
    return module


def slices(module: TDMPC2, n_slices: int = 8, terminal: bool = False) -> TensorDict:
    """A flat SliceSampler-like sample: ``n_slices`` consecutive runs of ``H`` steps."""
    obs_dim, act_dim = module.obs_shape[0], module.action_dim
    obs = torch.randn(n_slices, H + 1, obs_dim)
    term = torch.zeros(n_slices, H, 1, dtype=torch.bool)
    if terminal:
        term[::2, -1] = True
    low, high = module.actions.bias - module.actions.scale, module.actions.bias + module.actions.scale
    td = TensorDict(
        {
            "observation": obs[:, :-1],
            "action": low + (high - low) * torch.rand(n_slices, H, act_dim),
            "next": {"observation": obs[:, 1:], "reward": torch.randn(n_slices, H, 1), "terminated": term},
        },
        batch_size=[n_slices, H],
    )
    return td.reshape(-1)


def obs_td(module: TDMPC2, n: int, step_count: list[int] | None = None) -> TensorDict:
    steps = torch.tensor(step_count if step_count is not None else [5] * n).reshape(n, 1)
    return TensorDict({"observation": torch.randn(n, module.obs_shape[0]), "step_count": steps}, [n])


# ---------------------------------------------------------------- construction
def test_presets_discount_and_bad_args() -> None:
    assert parse_model_size("5M") == 5 and parse_model_size("1m") == 1 and parse_model_size(19) == 19
    with pytest.raises(ValueError, match="preset"):
        parse_model_size("7M")
    module = make_module(episode_length=200)
    assert module.discount == pytest.approx(0.975) and module.planner.discount == module.discount
    assert make_module(discount=0.9).discount == 0.9
    model_opt, pi_opt = module.optimizers()
    assert model_opt.param_groups[0]["lr"] == pytest.approx(0.3 * 3e-4)  # encoder at 0.3x
    assert model_opt.param_groups[1]["lr"] == pytest.approx(3e-4) and pi_opt.defaults["eps"] == 1e-5
    torch.testing.assert_close(module.actions.scale, torch.tensor([2.0]))  # Pendulum: [-2, 2]
    obs_spec, _ = specs()
    with pytest.raises(ValueError, match="bounded continuous"):
        TDMPC2(obs_spec, specs("CartPole-v1")[1], model_size="1M", **TINY)


# ---------------------------------------------------------------- update
@pytest.mark.parametrize("episodic", [False, True])
def test_update_invariants(episodic: bool) -> None:
    module = make_module("HockeyVsOpponent-v0", episodic=episodic, episode_length=251)
    model = module.model
    target_before = [p.clone() for p in model.target_q_nets.parameters()]
    params_before = {n: p.clone() for n, p in model.named_parameters()}
    metrics = module.update(slices(module, terminal=episodic))

    expected = {"consistency_loss", "reward_loss", "value_loss", "termination_loss", "total_loss", "pi_loss"}
    assert expected | {"grad_norm", "pi_grad_norm", "pi_entropy", "pi_scale"} <= set(metrics.keys())
    assert all(torch.isfinite(v) and not v.requires_grad for v in metrics.values())
    assert (metrics["termination_loss"] > 0) == episodic
    # Target Qs moved by the Polyak rule only: target = lerp(target_before, online_after, tau).
    for t, b, o in zip(model.target_q_nets.parameters(), target_before, model.q_nets.parameters()):
        torch.testing.assert_close(t, b + 0.01 * (o.detach() - b))
    assert not any(p.requires_grad for p in model.target_q_nets.parameters())
    # Gradients reached every trained network and every one of them moved.
    nets = {"encoder": model.encoder, "dynamics": model.dynamics, "reward_net": model.reward_net}
    nets |= {"q_nets": model.q_nets, "pi_net": model.pi_net}
    if episodic:
        nets["termination_net"] = model.termination_net
    for name, net in nets.items():
        assert sum(p.grad.abs().sum() for p in net.parameters()) > 0, name
        moved = [not torch.equal(p, params_before[f"{name}.{n}"]) for n, p in net.named_parameters()]
        assert any(moved), name
    # Losses ran in train mode (Q dropout); acting switches to eval mode and back.
    assert model.training and model.q_nets.training and not model.target_q_nets.training
    module.act(obs_td(module, 1))
    assert model.training and model.q_nets.training


def test_a_learned_entropy_coef_is_trained_with_the_prior_and_checkpointed() -> None:
    # Far below the prior's entropy: every update lowers the coefficient, by about Adam's step each.
    module = make_module("HockeyVsOpponent-v0", mpc=False, episode_length=251, target_entropy=-50.0,
                         entropy_coef=0.01)  # fmt: skip
    _, pi_opt = module.optimizers()
    coef = module.loss_fn.log_entropy_coef
    assert any(p is coef for g in pi_opt.param_groups for p in g["params"])
    assert not any(p is coef for g in module.optimizers()[0].param_groups for p in g["params"])
    batch = slices(module)
    logged = [module.update(batch)["pi_entropy_coef"].item() for _ in range(3)]
    assert logged[0] == pytest.approx(0.01) and logged[0] > logged[1] > logged[2]
    assert coef.exp().item() == pytest.approx(0.01 * math.exp(-3 * 3e-4), rel=1e-3)
    assert "loss_fn.log_entropy_coef" in module.state_dict()
    assert "loss_fn.log_entropy_coef" not in make_module().state_dict()  # the reference: a fixed bonus


def test_update_is_deterministic_under_a_seed() -> None:
    outs = []
    for _ in range(2):
        module = make_module(seed=3)
        batch = slices(module)
        torch.manual_seed(7)
        for _ in range(3):
            metrics = module.update(batch)
        outs.append((metrics["total_loss"], module.loss_fn.scale.value.clone()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


# ---------------------------------------------------------------- acting
def test_act_shapes_and_bounds() -> None:
    module = make_module(num_envs=3)
    td = module.act(obs_td(module, 3))
    action = td["action"]
    assert action.shape == (3, 1) and action.abs().max() <= 2.0
    assert module.act_eval(obs_td(module, 5))["action"].shape == (5, 1)  # any eval batch size
    assert module.act_eval(obs_td(module, 2))["action"].shape == (2, 1)
    assert set(module._eval_planners) == {5, 2}
    assert not any(k.startswith("_eval") for k in module.state_dict())
    with pytest.raises(ValueError, match="num_envs"):
        module.act(obs_td(module, 4))
    hockey = make_module("HockeyVsOpponent-v0", num_envs=2, mpc=False)
    a = hockey.act(obs_td(hockey, 2))["action"]
    assert a.shape == (2, 4) and a.abs().max() <= 1.0


def test_collecting_with_the_prior_samples_it_and_leaves_planning_to_evaluation() -> None:
    # A collapsed planner around 0 tells a plan (about 0) from the prior's mean (pushed to 0.9 by its bias).
    module = make_module(num_envs=2, num_pi_trajs=0, min_std=1e-4, max_std=1e-4, plan_training=False)
    last = module.model.pi_net[-1]  # [mean, log-std] of the one action: mean tanh(1.5) = 0.905 everywhere
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([1.5, 0.0]))
    td = obs_td(module, 2, step_count=[0, 0])
    warm_start = module.planner.prev_mean.clone()
    collected = torch.stack([module.act(td.clone())["action"] for _ in range(20)])
    # Sampled around the prior's mean (the action scale is 2), not the plan near 0.
    assert collected.std() > 1e-3 and (collected.mean() / 2 - 0.905).abs() < 0.05
    assert torch.equal(module.planner.prev_mean, warm_start)  # the training planner never ran
    torch.testing.assert_close(module.act_eval(td.clone())["action"], torch.zeros(2, 1), atol=1e-2, rtol=0)


def test_eval_is_noise_free_mean_of_the_plan() -> None:
    # A collapsed sampling distribution: the plan stays at its initial mean, so eval returns exactly it
    # while training adds exploration noise around it.
    module = make_module(num_envs=2, num_pi_trajs=0, min_std=1e-3, max_std=1e-3)
    td = obs_td(module, 2, step_count=[0, 0])
    torch.testing.assert_close(module.act_eval(td.clone())["action"], torch.zeros(2, 1), atol=1e-2, rtol=0)
    noisy = module.act(td.clone())["action"]
    assert noisy.abs().max() < 0.05


def test_warm_start_resets_on_new_episodes() -> None:
    # With a collapsed sampling std the executed action is the initial mean's first step (times the
    # action scale 2): the previous plan shifted by one step, or zero where step_count is 0.
    module = make_module(num_envs=3, num_pi_trajs=0, min_std=1e-4, max_std=1e-4)
    prev = torch.tensor([0.2, -0.4, 0.6]).reshape(3, 1, 1).expand(3, H, 1).clone()
    module.planner.prev_mean.copy_(prev)
    action = module.act(obs_td(module, 3, step_count=[0, 7, 0]))["action"]
    torch.testing.assert_close(action, torch.tensor([[0.0], [-0.8], [0.0]]), atol=5e-3, rtol=0)
    assert module.planner.prev_mean[[0, 2]].abs().max() < 1e-2
    torch.testing.assert_close(module.planner.prev_mean[1, :-1], prev[1, 1:], atol=1e-3, rtol=0)
    # Without step counts (and without is_init) the warm start is kept for every env.
    module.planner.prev_mean.copy_(prev)
    td = TensorDict({"observation": torch.randn(3, 3)}, [3])
    torch.testing.assert_close(module.act(td)["action"], 2 * prev[:, 1], atol=5e-3, rtol=0)


# ---------------------------------------------------------------- checkpoints
def test_state_dict_round_trip_includes_planner_and_scale() -> None:
    module = make_module(num_envs=2, episodic=True)
    for _ in range(2):
        module.update(slices(module))
    module.act(obs_td(module, 2))
    state = module.state_dict()
    assert {"planner.warm_start.value", "loss_fn.scale.value", "frames", "actions.scale"} <= set(state)
    assert state["planner.warm_start.value"].abs().sum() > 0
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    other = make_module(num_envs=2, episodic=True, seed=1)
    other.load_state_dict(torch.load(buf, weights_only=True))
    for key, value in module.state_dict().items():
        assert torch.equal(other.state_dict()[key], value), key


# ---------------------------------------------------------------- CLI smoke runs
SMOKE = [
    "total_frames=300",
    "collect.warmup_frames=100",
    "device=cpu",
    "progress_bar=false",
    "eval.every_frames=0",
    "eval.episodes=1",
    "replay.batch_size=24",
    "checkpoint.every_frames=150",
    *TINY_TDMPC2,  # planning every step was most of a smoke run's time
    "log_every_n_updates=50",
]


def run_fit(cwd: Path, *overrides: str) -> dict:
    proc = run_main(cwd, "fit", *overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "extra"),
    [
        ("tdmpc2_pendulum", ["logger=none"]),
        # Two envs: a batched plan and interleaved trajectories in the replay buffer; MLflow in tmp_path;
        # a curriculum of training modes (evaluation stays NORMAL).
        (
            "tdmpc2_hockey",
            [
                "env.num_envs=2",
                "env.eval_num_envs=2",
                "replay.device=cpu",
                "env.kwargs.mode={NORMAL: 0.4, TRAIN_SHOOTING: 0.3, TRAIN_DEFENSE: 0.3}",
            ],
        ),
    ],
)
def test_smoke_fit_through_the_cli(name: str, extra: list[str], tmp_path: Path) -> None:
    out = run_fit(tmp_path, f"+experiment={name}", *SMOKE, *extra)
    assert out["frames"] >= 300 and out["updates"] >= 300 and "eval/return_mean" in out
    if name == "tdmpc2_hockey":
        import mlflow

        client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
        (run,) = client.search_runs([client.get_experiment_by_name("rl_lightning").experiment_id])
        for opponent in ("weak", "strong"):
            for key in ("win_rate", "loss_rate", "draw_rate", "return_mean"):
                assert f"eval/{opponent}/{key}" in run.data.metrics
        assert "train/consistency_loss" in run.data.metrics and "train/pi_scale" in run.data.metrics
    # The checkpoint rebuilds the module from its stored config and loads strictly, planner included.
    ckpt = load_checkpoint(tmp_path / out["run_dir"] / "checkpoints" / "last.ckpt")  # the safe loader
    cfg = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    module = build_module(cfg, env_config(cfg))
    module.load_state_dict(ckpt["state_dict"])
    assert module.planner.num_envs == cfg.env.num_envs
    assert module.planner.prev_mean.abs().sum() > 0
    if name == "tdmpc2_pendulum":
        # evaluate's plan=false acts with the policy prior's mean, plan=true with the planner: each gives the
        # figures of the module acting that way, and they differ.
        last = str(tmp_path / out["run_dir"] / "checkpoints" / "last.ckpt")
        module.on_load_checkpoint(ckpt)
        returns = []
        for plan in (False, True):
            proc = run_main(tmp_path, "evaluate", f"ckpt={last}", "episodes=1", f"plan={str(plan).lower()}",
                            "split=validation")  # fmt: skip
            assert proc.returncode == 0, proc.stderr[-2000:]
            module.hparams.mpc = plan
            expected = evaluate_policy(module, env_config(cfg), 1, int(cfg.eval.seed))
            got = json.loads(proc.stdout.strip().splitlines()[-1])
            assert got["return_mean"] == pytest.approx(expected["return_mean"], abs=1e-3), plan
            returns.append(got["return_mean"])
        assert returns[0] != returns[1]


@pytest.mark.slow
def test_resume_with_several_envs_continues_their_trajectories(tmp_path: Path) -> None:
    """A resumed run's envs continue their episodes, and their steps the trajectories they belong to: the
    same ids, the step counts going on (with interleaved envs the slice sampler groups steps by id). Envs
    that start afresh on a resume (worker processes) take new ids: ``tests/data/test_collectors.py``."""
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    from rl_lightning.data.replay import TRAJ_KEY

    # Few updates: what is checked is the stored ids, not what the model learns.
    common = [
        "+experiment=tdmpc2_pendulum",
        *SMOKE,
        "logger=none",
        "env.num_envs=2",
        "collect.updates_per_frame=0.1",
    ]
    first = run_fit(tmp_path, *common)
    second = run_fit(tmp_path, *[o for o in common if not o.startswith("total_frames")], "total_frames=400",
                     "ckpt_path=last")  # fmt: skip
    assert second["run_dir"] == first["run_dir"] and second["frames"] == 400
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000))  # the pendulum experiment's capacity
    rb.loads(tmp_path / second["run_dir"] / "checkpoints" / "last.ckpt.replay")
    stored = rb.storage[: len(rb)]
    ids, steps = stored.get(TRAJ_KEY), stored.get("step_count").reshape(-1)
    old, new = ids[:300], ids[300:]
    assert len(new) == 100
    # Pendulum episodes last 200 steps: the 2 envs are in their first episode all along, 150 steps each
    # before the resume and 50 after.
    assert old.unique().tolist() == new.unique().tolist() == [0, 1]
    for i in (0, 1):
        assert torch.equal(steps[ids == i], torch.arange(200))


def test_a_planning_agents_snapshot_acts_with_its_prior() -> None:
    """Self-play needs a plain-module policy; a planning TD-MPC2 has none to export, and its snapshot is
    the policy prior's mean action in the env's units."""
    module = make_module("HockeyVsOpponent-v0", mpc=True, episode_length=251)
    with pytest.raises(NotImplementedError, match="acts by planning"):
        module.export_policy()
    obs = torch.randn(3, module.obs_shape[0])
    expected = module.actions.to_env(module.model.pi(module.model.encode(obs)).mean)
    torch.testing.assert_close(module.snapshot_policy()(obs), expected)
    prior = make_module("HockeyVsOpponent-v0", mpc=False, episode_length=251)
    torch.testing.assert_close(prior.snapshot_policy()(obs), prior.export_policy()(obs))


def test_a_checkpoint_plans_with_another_horizon_than_it_trained_with() -> None:
    """``evaluate plan=true planner.horizon=3`` on a horizon-1 run: the weights load, and the collection
    planner's warm start (the last plan's mean, whose shape follows the horizon) starts cold."""
    one = make_module(horizon=1)
    ckpt = {"state_dict": {k: v.clone() for k, v in one.state_dict().items()}}
    ckpt["state_dict"]["planner.warm_start.value"].fill_(0.5)
    three = make_module(horizon=3, seed=1)
    three.on_load_checkpoint(ckpt)
    three.load_state_dict(ckpt["state_dict"])
    assert three.planner.prev_mean.shape == (1, 3, 1) and not three.planner.prev_mean.any()
    assert all(torch.equal(a, b) for a, b in zip(one.model.parameters(), three.model.parameters()))
