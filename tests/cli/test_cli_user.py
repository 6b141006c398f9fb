"""What a new user meets: one clear line for bad input (nothing written), the run's report, `last`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.cli import mlflow_client, run_cli
from omegaconf import OmegaConf

from rl_lightning.cli import main

QUICK = [
    "+experiment=dqn_cartpole",
    "device=cpu",
    "progress_bar=false",
    "total_frames=600",
    "collect.frames_per_batch=50",
    "collect.warmup_frames=100",
    "eval.every_frames=200",
    "eval.episodes=3",
    "checkpoint.every_frames=200",
]


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fit", "+experiment=dqn_cartpole", "total_frames=abc"], "total_frames='abc': expected an integer"),
        (["fit", "+experiment=dqn_cartpole", "seed=abc"], "seed='abc': expected an integer"),
        (["fit", "+experiment=dqn_cartpole", "device=gpu"], "device='gpu': choose auto, cpu or cuda"),
        (["fit", "+experiment=dqn_cartpole", "algo.lr=fast"], "algo.lr='fast': expected a number"),
        (["fit", "+experiment=dqn_cartpole", "collect.warmup_frames=1.5"], "collect.warmup_frames=1.5"),
        (["fit", "+experiment=dqn_cartpole", "env.num_envs=two"], "env.num_envs='two': expected an integer"),
        (
            ["fit", "+experiment=dqn_cartpole", "env=cartpol"],
            "unknown env 'cartpol'; choose one of: "
            "atari, cartpole, gym, hockey, hockey_discrete, marinenav, marinenav_continuous, minatar, "
            "pendulum",
        ),
        (["fit", "+experiment=dqn_cartpole", "algo=dqnn"], "unknown algo 'dqnn'; choose one of: "),
        (
            ["fit"],
            "fit needs an experiment or an algorithm and an env: python -m rl_lightning fit +experiment",
        ),
        (["fit", "total_frames=100"], "or fit algo=NAME env.id=GYMNASIUM_ID"),
        (
            ["fit", "algo=sac", "env.id=CartPole-v1"],
            "SAC here is for continuous actions, but the env's actions are discrete",
        ),
        (["fit", "algo=sac", "env.id=NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["evaluate", "ckpt=mlflow.db"], "mlflow.db is not a checkpoint written by rl_lightning fit"),
        (["evaluate", "ckpt=config.yaml"], "config.yaml is not a checkpoint written by rl_lightning fit"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    args: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlflow.db").write_bytes(b"SQLite format 3\x00" + bytes(100))
    (tmp_path / "config.yaml").write_text("name: x\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(args) == 2
    assert message in one_error_line(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run directory, no new store


def test_fit_says_what_it_runs_and_where_the_checkpoints_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["fit", *QUICK, "logger=none"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].startswith("fit dqn_cartpole: DQN on CartPole-v1, 600 frames, seed 0, cpu -> runs/")
    summary = json.loads(lines[-1])
    assert summary["frames"] == 600  # exactly the budget, not the next multiple of a collection
    assert f"last checkpoint: {summary['last_ckpt']}" in out
    assert f"best checkpoint: {summary['best_ckpt']} (eval/return_mean {summary['best_score']:.2f}" in out
    assert f"python -m rl_lightning evaluate ckpt={summary['best_ckpt']}" in out
    # Evaluating the best checkpoint on the validation split replays the evaluation that made it best.
    assert main(["evaluate", f"ckpt={summary['best_ckpt']}", "split=validation", "logger=none"]) == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert stats["return_mean"] == pytest.approx(summary["best_score"], abs=1e-4)


def test_gpu_sized_experiment_on_a_cpu_points_to_its_cpu_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    from rl_lightning.cli import compose
    from rl_lightning.cli.fit import fit

    monkeypatch.setattr("lightning.Trainer.fit", lambda *a, **k: None)  # only the start of the command
    fit(compose(["+experiment=tdmpc2_hockey", "device=cpu", "logger=none", "progress_bar=false"]))
    out = capsys.readouterr().out
    assert "tdmpc2_hockey is sized for a GPU" in out and "+experiment=tdmpc2_hockey_cpu" in out
    fit(compose(["+experiment=tdmpc2_hockey_cpu", "device=cpu", "logger=none", "progress_bar=false"]))
    assert "sized for a GPU" not in capsys.readouterr().out


@pytest.mark.slow
def test_last_means_the_newest_real_run_of_the_same_experiment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["fit", *QUICK, "logger=none"]) == 0
    real = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_dir"]
    assert main(["fit", *QUICK, "+debug=quick"]) == 0  # newer, but a debug run: kept apart
    debug = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_dir"]
    assert debug.startswith("runs/debug/dqn_cartpole/")
    assert main(["fit", *QUICK, "logger=none", "total_frames=700", "ckpt_path=last"]) == 0
    resumed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert resumed["run_dir"] == real and resumed["frames"] == 700
    # A checkpoint of another algorithm is refused, not silently loaded into this one.
    last = Path(real) / "checkpoints" / "last.ckpt"
    assert main(["fit", "+experiment=tdmpc2_pendulum", "logger=none", f"ckpt_path={last}"]) == 2
    assert "is a run of DQN on CartPole-v1" in one_error_line(capsys)


def test_a_new_run_never_takes_the_directory_of_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # Two runs of one experiment started in the same second resolve ${now} to the same run_dir.
    import mlflow

    monkeypatch.chdir(tmp_path)
    dirs = []
    for seed in (0, 1):
        assert main(["fit", *QUICK, "total_frames=200", "run_dir=runs/same", f"seed={seed}"]) == 0
        dirs.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_dir"])
    assert dirs == ["runs/same", "runs/same-1"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    ids = [(tmp_path / d / "mlflow_run_id").read_text().strip() for d in dirs]
    assert ids[0] != ids[1]
    assert [client.get_run(i).data.params["seed"] for i in ids] == ["0", "1"]
    assert OmegaConf.load(tmp_path / dirs[1] / "config.yaml").run_dir == "runs/same-1"


def test_a_run_started_at_the_same_moment_as_another_takes_the_next_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import rl_lightning.cli.run as run_module

    monkeypatch.chdir(tmp_path)
    look = run_module._resolve_resume
    other: list[Path] = []

    def another_run_makes_it_first(cfg):  # between this run's look and its claim of the directory
        run_dir, ckpt = look(cfg)
        if not other:
            run_dir.mkdir(parents=True)
            other.append(run_dir)
        return run_dir, ckpt

    monkeypatch.setattr(run_module, "_resolve_resume", another_run_makes_it_first)
    assert main(["fit", *QUICK, "total_frames=200", "run_dir=runs/same"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_dir"] == "runs/same-1"
    assert other == [Path("runs/same")] and not any(other[0].iterdir())  # the other run's, left alone


@pytest.mark.slow
def test_progress_bar_counts_frames_to_the_total_and_prints_evaluations_above_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "160")
    args = [a for a in QUICK if a != "progress_bar=false"]
    assert main(["fit", *args, "progress_bar=true", "logger=none"]) == 0
    out = capsys.readouterr().out
    bar = [ln for ln in out.splitlines() if ln.startswith("frames ")]
    assert bar, out
    final = bar[-1]
    assert "600/600" in final and "frames/s" in final and "updates" in final and "eval" in final
    assert "it/s" not in out  # one rate: environment frames per second
    evals = [ln for ln in out.splitlines() if ln.startswith("eval @ ")]
    assert [ln.split(" frames")[0] for ln in evals] == ["eval @ 200", "eval @ 400", "eval @ 600"]


def test_a_user_error_during_the_fit_leaves_no_run_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import mlflow

    from rl_lightning.data.datamodule import RLDataModule

    monkeypatch.chdir(tmp_path)

    def broken(self):
        raise ValueError("env.kwargs.level=9 is out of range; choose 1 to 3.")

    monkeypatch.setattr(RLDataModule, "start_collection", broken)
    assert main(["fit", *QUICK]) == 2
    assert "env.kwargs.level=9 is out of range" in one_error_line(capsys)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("config.yaml"))
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("rl_lightning")
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["algo=sac", "env.id=MountainCarContinuous-v0"], "sac_mountaincarcontinuous_v0"),
        (["algo=iqn", "env.id=Acrobot-v1"], "iqn_acrobot_v1"),
    ],
)
@pytest.mark.slow
def test_any_gymnasium_env_trains_without_a_preset_and_names_the_run(
    args: list[str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``fit algo=NAME env.id=ID`` from an empty directory: the env's limits and spaces from the id, the
    algorithm's settings from its config, the run named after both."""
    monkeypatch.chdir(tmp_path)
    # Past the default 1000 warm-up frames, with a few updates on the config's batches.
    quick = ["total_frames=1064", "device=cpu", "progress_bar=false", "logger=none", "eval.episodes=1"]
    assert main(["fit", *args, *quick]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["frames"] == 1064 and summary["updates"] > 0
    assert summary["run_dir"].startswith(f"runs/{name}/")
    assert OmegaConf.load(Path(summary["run_dir"]) / "config.yaml").name == name


def test_names_follow_the_algorithm_and_the_env_unless_given() -> None:
    from rl_lightning.cli import compose

    assert compose(["algo=sac", "env.id=LunarLanderContinuous-v3"]).name == "sac_lunarlandercontinuous_v3"
    assert compose(["algo=sac", "env=pendulum"]).name == "sac_pendulum_v1"
    assert compose(["+experiment=sac_pendulum"]).name == "sac_pendulum"  # a preset keeps its name
    assert compose(["+experiment=sac_pendulum", "env.id=BipedalWalker-v3"]).name == "sac_bipedalwalker_v3"
    assert compose(["algo=dqn", "env.id=Acrobot-v1", "name=mine"]).name == "mine"
    cfg = compose(["algo=dqn", "env.id=Acrobot-v1"])
    assert cfg.env.max_episode_steps is None and cfg.run_dir.startswith("runs/dqn_acrobot_v1/")


@pytest.mark.slow
def test_without_a_terminal_progress_is_one_whole_line_every_few_seconds(tmp_path: Path) -> None:
    args = [a for a in QUICK if a != "progress_bar=false"]
    proc = run_cli(tmp_path, "fit", *args, "progress_bar=true", "progress_every_s=0.01", "logger=none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [ln for ln in proc.stdout.splitlines() if re.match(r"(warm-up|frames) \d+/600 \(\d+%\) · ", ln)]
    assert len(lines) >= 3 and lines[-1].startswith("frames 600/600 (100%) · ")
    assert "frames/s" in lines[-1] and "eval " in lines[-1] and "updates " in lines[-1]
    # The last line gives the whole run's rate and time, not a dash.
    assert re.search(r" · [\d,]+ frames/s · done in [\d,]+ s · ", lines[-1]), lines[-1]
    assert "━" not in proc.stdout and "\r" not in proc.stdout  # no bar drawn into the log


def test_ui_prints_the_address_of_the_runs_curves(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["fit", *QUICK, "total_frames=200", "eval.every_frames=0"]) == 0
    capsys.readouterr()
    assert main(["ui", "ui.dry_run=true", "ui.port=5123"]) == 0
    out = capsys.readouterr().out
    client = mlflow_client(tmp_path)
    experiment = client.get_experiment_by_name("rl_lightning")
    assert f"open http://127.0.0.1:5123/rl-lightning/experiments/{experiment.experiment_id}\n" in out
    assert f"sqlite:///{tmp_path / 'mlflow.db'}" in out
    # The experiment is tagged as model training (MLflow's own hint, which the address makes certain).
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"


def test_the_ui_page_stores_the_model_training_view_and_opens_the_runs() -> None:
    """The app plugin's page (served by `ui`) writes the UI's workflow type where MLflow 3's UI reads it,
    and opens the experiment's runs as charts in that view; an id is a number, nothing else."""
    from fastapi.testclient import TestClient

    from rl_lightning.training.mlflow_app import OPEN_ROUTE, STORAGE_KEY, app

    page = TestClient(app, base_url="http://localhost").get(OPEN_ROUTE.format(experiment_id=7))
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert f'localStorage.setItem("{STORAGE_KEY}", "\\"machine_learning\\"")' in page.text
    assert (
        'location.replace("/#/experiments/7/runs?workflowType=machine_learning&compareRunsMode=CHART")'
        in page.text
    )
    assert (
        TestClient(app, base_url="http://localhost").get("/rl-lightning/experiments/x<script>").status_code
        == 422
    )


def test_ui_without_runs_opens_the_experiments_and_refuses_other_loggers(
    tmp_path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["ui", "ui.dry_run=true"]) == 0
    assert "open http://127.0.0.1:5000/\n" in capsys.readouterr().out
    assert main(["ui", "logger=csv"]) == 2
    assert "tensorboard --logdir runs" in one_error_line(capsys)
    assert main(["--help"]) == 0 and "\n  ui " in capsys.readouterr().out
