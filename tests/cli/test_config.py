"""Every experiment composes and instantiates; the CLI's one-line errors and help."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_lightning.algos.base import RLModule
from rl_lightning.cli import compose, experiments, main
from rl_lightning.cli.run import build_run

EXPERIMENTS = sorted(experiments())


def test_there_are_experiments():
    assert "dqn_cartpole" in EXPERIMENTS


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_composes_and_instantiates(name: str, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose([f"+experiment={name}", "logger=none", "device=cpu", f"run_dir={tmp_path / 'run'}"])
    assert cfg.name == name
    run = build_run(cfg)
    assert run.datamodule.collect.total_frames == cfg.total_frames
    assert type(run.module).__name__ == cfg.algo._target_.rsplit(".", 1)[-1]
    assert isinstance(run.module, RLModule)
    assert {"update", "act"} <= set(run.module.hot_paths)
    # The data module's sampler follows the algorithm's replay requirements.
    needs = run.module.replay_requirements()
    assert run.datamodule.replay_cfg.slice_len == needs.slice_len
    # Hydra never hands a DictConfig to a module (it breaks torch.compile).
    assert not any(type(v).__module__.startswith("omegaconf") for v in vars(run.module).values())


def test_group_and_short_overrides_reach_the_objects(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = compose(
        [
            "+experiment=dqn_cartpole",
            "logger=none",
            "total_frames=1234",
            "seed=7",
            "env.num_envs=3",
            "algo.double_dqn=true",
            "replay.device=cpu",
            f"run_dir={tmp_path / 'run'}",
        ]
    )
    run = build_run(cfg)
    assert run.datamodule.collect.total_frames == 1234 and run.datamodule.seed == 7
    assert run.datamodule.env_cfg.num_envs == 3
    assert run.module.hparams.double_dqn
    assert str(run.datamodule.replay_cfg.device) == "cpu"


def test_hockey_curriculum_override_reaches_the_envs_and_not_the_evaluation(tmp_path, monkeypatch):
    from rl_lightning.cli.run import env_config
    from rl_lightning.envs import make_env
    from rl_lightning.envs.hockey import Mode

    monkeypatch.chdir(tmp_path)
    curriculum = "{NORMAL: 0.5, TRAIN_SHOOTING: 0.25, TRAIN_DEFENSE: 0.25}"
    cfg = compose(["+experiment=tdmpc2_hockey_cpu", "logger=none", f"env.kwargs.mode={curriculum}"])
    env = make_env(env_config(cfg), num_envs=2, seed=0)
    try:
        for e in env.envs:
            mix = e.unwrapped.mode_mix
            assert mix is not None and dict(zip(mix.choices, mix.probabilities)) == {
                Mode.NORMAL: 0.5,
                Mode.TRAIN_SHOOTING: 0.25,
                Mode.TRAIN_DEFENSE: 0.25,
            }
    finally:
        env.close()
    # Evaluation keeps to NORMAL games: every variant fixes the mode.
    assert all(v["mode"] == "NORMAL" for v in cfg.eval.variants.values())


def test_cfg_job_prints_the_config(capsys):
    assert main(["fit", "+experiment=dqn_cartpole", "--cfg", "job"]) == 0
    out = capsys.readouterr().out
    assert "name: dqn_cartpole" in out and "_target_: rl_lightning.algos.dqn.DQN" in out


def test_help_lists_commands_and_experiments(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "fit" in out and "evaluate" in out and "dqn_cartpole" in out and "rl_lightning ui" in out


AGENTS = Path(__file__).resolve().parents[2] / "benchmarks" / "agents"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit", "+experiment=nope"], "unknown experiment 'nope'"),
        (["fit", "+experiment=dqn_cartpole", "learning_rate=3"], "unknown config key 'learning_rate'"),
        (["fit", "+experiment=dqn_cartpole", "env.id=NoSuchEnv-v9"], "Unknown gymnasium id 'NoSuchEnv-v9'"),
        (["fit", "+experiment=dqn_cartpole", "env.id=Pendulum-v1"], "DQN needs a discrete action space"),
        (["evaluate", "ckpt=/no/such.ckpt"], "checkpoint not found"),
        (["fit", "+experiment=dqn_cartpole", "ckpt_path=/no/such.ckpt"], "checkpoint not found"),
        (["frobnicate"], "unknown command 'frobnicate'"),
        (["fit", "+experiment=dqn_cartpole", "algo.loss=huber"], "loss must be 'l2' or 'smooth_l1'"),
        # A misspelt key gets its close names; an algorithm's gets no "+" advice (it takes no new arguments).
        (
            ["fit", "+experiment=dqn_cartpole", "algo.lrr=0.1"],
            "takes no such argument; did you mean algo.lr?",
        ),
        (
            ["fit", "+experiment=dqn_cartpole", "+algo.lrr=0.1"],
            "not an argument of DQN; did you mean algo.lr?",
        ),
        (
            ["fit", "+experiment=dqn_cartpole", "total_frame=5"],
            "'total_frame'; did you mean total_frames? or add a new key with +",
        ),
        (["evaluate", "ckpt=x.ckpt", "split=training"], "split=training: choose one of validation, test"),
        (["evaluate", f"ckpt={AGENTS}/hockey_tdmpc2.ckpt", "planner.horizon=3"], "add plan=true"),
    ],
)
def test_bad_input_gives_one_clear_line_and_exit_code_2(args, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main([*args, "logger=none"] if args[0] != "frobnicate" else args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
