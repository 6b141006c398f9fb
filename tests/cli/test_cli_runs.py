"""End-to-end runs through the real CLI: smoke fits, MLflow records, resume, Ctrl-C, evaluate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import SMOKE, TINY_TDMPC2, interrupt_cli, mlflow_client, mlflow_runs, run_main
from omegaconf import OmegaConf
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rl_lightning.cli import experiments
from rl_lightning.cli.fit import EXPERIMENT_KIND_TAG, NOT_LOGGED, training_params

pytestmark = pytest.mark.slow

#: TD-MPC2 at toy size (the suite's tiny model and one-iteration planner): the smoke run checks the wiring,
#: not the learning, and planning every step of collection and evaluation was most of its time.
TDMPC2_TINY = [
    *TINY_TDMPC2, "replay.batch_size=24", "replay.device=cpu",
    "env.num_envs=1",  # one env finishes hockey episodes (up to 251 steps) within the smoke run's 300 frames
    "eval.episodes=1",  # a game per opponent: up to 251 planned steps each
]  # fmt: skip
#: Presets that compile their updates through the hockey curriculum (the smoke run leaves the compile out).
COMPILED_CURRICULA = {"tdmpc2_hockey_curriculum", "tdmpc2_hockey_planning"}
#: PPO's presets cut to rollouts that divide the smoke run's 300 frames.
PPO_SMALL = ["env.num_envs=2", "algo.rollout_steps=50", "algo.epochs=1", "algo.minibatches=2"]
#: Experiments whose smoke fit, with checks of their own, is in tests/algos/test_tdmpc2_module.py, (the
#: image games, +debug=quick with their frame store) tests/envs/test_image_envs.py and (marine navigation,
#: whose episodes outlast 300 frames) tests/envs/test_marinenav_training.py and tests/data/test_agent_rows.py.
SMOKED_ELSEWHERE = {"tdmpc2_pendulum", "tdmpc2_hockey"} | {
    e for e in experiments() if e.endswith(("_minatar", "_atari", "_atari_cpu")) or "_marinenav" in e
}


def summary(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(set(experiments()) - SMOKED_ELSEWHERE))
def test_smoke_fit_records_an_mlflow_run_evaluates_and_resumes(name: str, tmp_path: Path):
    frames = 300
    overrides = [
        f"+experiment={name}",
        "collect.warmup_frames=100",
        "device=cpu",
        *SMOKE,
        # Batches of 32 (TD-MPC2's tiny setup has its own): the wiring is checked, not the learning, and an
        # update of 256 rows costs most of a smoke run.
        *(TDMPC2_TINY if name.startswith("tdmpc2") else ["replay.batch_size=32"]),
        # The curriculum opens with 81-step drills: one env (not 4) finishes episodes within 300 frames.
        *(["env.num_envs=1"] if name.endswith("_curriculum") else []),
        # PPO: three rollouts of 2 envs x 50 steps, one short pass each (a preset's rollout is thousands).
        *(PPO_SMALL if name.startswith("ppo") else []),
        # Without the presets' compile callback (tests/callbacks check it): compiling takes about 2 minutes.
        *(["callbacks=[default,hockey_curriculum]"] if name in COMPILED_CURRICULA else []),
    ]
    out = summary(run_main(tmp_path, "fit", *overrides, f"total_frames={frames}"))
    assert out["frames"] == frames and out["updates"] > 0
    assert "eval/return_mean" in out
    (run,) = mlflow_runs(tmp_path)
    client = mlflow_client(tmp_path)
    assert run.info.run_name == name and run.info.status == "FINISHED"
    # The training config once, flattened; nothing of other commands; the config file as an artifact.
    params = run.data.params
    assert params["name"] == name and "algo._target_" in params
    # Exactly the flattened training config: no other command's keys, no unprefixed duplicates.
    logged_cfg = OmegaConf.load(tmp_path / out["run_dir"] / "config.yaml")
    assert set(params) == set(training_params(logged_cfg)), sorted(
        set(params) ^ set(training_params(logged_cfg))
    )
    assert not [k for k in params if k.split(".")[0] in NOT_LOGGED]
    assert "config.yaml" in [a.path for a in client.list_artifacts(run.info.run_id)]
    # Shown as a model-training experiment in MLflow 3's UI; where the checkpoints are, as tags.
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.tags.get(EXPERIMENT_KIND_TAG[0]) == EXPERIMENT_KIND_TAG[1]
    assert Path(run.data.tags["checkpoint.last"]).is_file()
    metrics = set(run.data.metrics)
    assert {"eval/return_mean", "eval/return_std", "train/episode_return", "train/episode_length"} <= metrics
    history = client.get_metric_history(run.info.run_id, "eval/return_mean")
    assert history[-1].step == out["frames"]  # metrics are logged against environment frames
    # The checkpoint loads safely and evaluates, and the run resumes from it into the same MLflow run, whose
    # training metrics go on past the frames of the first part.
    evaluated = run_main(tmp_path, "evaluate", f"ckpt={out['last_ckpt']}", "episodes=1", "logger=none")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    resumed = summary(run_main(tmp_path, "fit", *overrides, f"total_frames={frames + 100}", "ckpt_path=last"))
    assert resumed["frames"] == frames + 100 and resumed["run_dir"] == out["run_dir"]
    (run,) = mlflow_runs(tmp_path)
    history = client.get_metric_history(run.info.run_id, "eval/return_mean")
    assert sorted(m.step for m in history) == [frames, frames + 100]
    assert any(m.step > frames for m in client.get_metric_history(run.info.run_id, "train/episodes"))


def read_replay(path: Path) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000))
    rb.loads(path)
    return rb


DQN_SHORT = (
    "+experiment=dqn_cartpole",
    "device=cpu",
    "collect.frames_per_batch=64",
    "collect.warmup_frames=128",
    "checkpoint.every_frames=256",
    *SMOKE,
)


def test_resume_continues_frames_replay_and_run(tmp_path: Path):
    first = summary(run_main(tmp_path, "fit", *DQN_SHORT, "total_frames=512"))
    run_dir = tmp_path / first["run_dir"]
    last = run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    dm_state = next(v for k, v in saved.items() if k.endswith("RLDataModule"))
    assert dm_state["frames"] == 512
    before = read_replay(Path(str(last) + ".replay"))
    assert len(before) == 512
    first_obs = before.storage.get(torch.arange(512))["observation"].clone()

    second = summary(run_main(tmp_path, "fit", *DQN_SHORT, "total_frames=1024", "ckpt_path=last"))
    assert second["run_dir"] == first["run_dir"] and second["frames"] == 1024
    after = read_replay(Path(str(last) + ".replay"))
    assert len(after) == 1024
    assert torch.equal(after.storage.get(torch.arange(512))["observation"], first_obs)
    # Optimizer and target network came back: the resumed run continued the same update count.
    assert second["updates"] > first["updates"]
    (run,) = mlflow_runs(tmp_path)  # the same MLflow run, continued
    steps = [m.step for m in mlflow_client(tmp_path).get_metric_history(run.info.run_id, "eval/return_mean")]
    assert steps[0] == 512 and steps[-1] == 1024


def test_dqn_with_per_and_n_step_through_the_cli(tmp_path: Path):
    gamma = 0.9
    out = summary(
        run_main(
            tmp_path, "fit", *DQN_SHORT, "total_frames=512", "logger=none", "replay.prioritized=true",
            "replay.n_step=3", f"algo.gamma={gamma}",
        )
    )  # fmt: skip
    last = tmp_path / out["run_dir"] / "checkpoints" / "last.ckpt"
    replay = Path(str(last) + ".replay")
    stored = read_replay(replay).storage[:512]
    steps = stored["steps_to_next_obs"].reshape(-1).float()
    torch.testing.assert_close(stored["next", "reward"].reshape(-1), (1 - gamma**steps) / (1 - gamma))
    # The saved priorities were written back by the updates: far more than the one value new rows get.
    priorities = torch.load(next(replay.rglob("priorities.pt")), weights_only=True)["priority"][:512]
    assert priorities.unique().numel() > 50


def test_ctrl_c_saves_a_checkpoint_that_resumes(tmp_path: Path):
    proc = interrupt_cli(
        tmp_path,
        "fit",
        *DQN_SHORT,
        "total_frames=200000",
        after_path=tmp_path / "runs" / "dqn_cartpole",
        after_glob="*/checkpoints/last.ckpt",
    )
    assert proc.returncode == 130, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "stopping at the next safe point" in proc.stderr
    assert "interrupted:" in proc.stdout and "resume with" in proc.stdout
    (last,) = tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")
    dm_state = next(v for k, v in torch.load(last, weights_only=True).items() if k.endswith("RLDataModule"))
    assert dm_state["frames"] >= 256 and Path(str(last) + ".replay").is_dir()
    (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "KILLED"  # not FAILED: the user stopped it, and it resumes
    out = summary(
        run_main(tmp_path, "fit", *DQN_SHORT, f"total_frames={dm_state['frames'] + 128}", "ckpt_path=last")
    )
    assert out["frames"] == dm_state["frames"] + 128
    (run,) = mlflow_runs(tmp_path)
    assert run.info.status == "FINISHED"


def test_evaluate_reloads_a_checkpoint_prints_and_logs(tmp_path: Path):
    first = summary(run_main(tmp_path, "fit", *DQN_SHORT, "total_frames=256"))
    ckpt = tmp_path / first["run_dir"] / "checkpoints" / "last.ckpt"
    proc = run_main(
        Path("/"),
        "evaluate",
        f"ckpt={ckpt}",
        "episodes=3",
        f"logger.tracking_uri=sqlite:///{tmp_path}/mlflow.db",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test: 3 episodes (eval seed 1000000000): return" in proc.stdout  # held-out episodes
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    # CartPole pays 1 per step: the mean return is the mean length, and a printed std matches the JSON's.
    assert stats["return_mean"] == pytest.approx(stats["length_mean"])
    assert f"return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}" in proc.stdout
    names = {r.info.run_name for r in mlflow_runs(tmp_path)}
    assert "dqn_cartpole-evaluate" in names
    # plan= chooses how TD-MPC2 acts; a DQN checkpoint has nothing to plan with: one line, exit code 2.
    planned = run_main(tmp_path, "evaluate", f"ckpt={ckpt}", "plan=true", "logger=none")
    assert planned.returncode == 2 and planned.stderr.strip().splitlines() == [
        "error: plan=True chooses how TD-MPC2 acts; this checkpoint's algorithm has no planner."
    ]
