"""`fit -m`: Hydra multirun sweeps, each job its own run, tagged with the sweep; Optuna tunes on the score."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rl_lightning.cli import main

mlflow = pytest.importorskip("mlflow")

QUICK = [
    "+experiment=dqn_cartpole", "device=cpu", "progress_bar=false", "total_frames=300",
    "collect.warmup_frames=100", "collect.frames_per_batch=50", "eval.every_frames=150", "eval.episodes=1",
    "checkpoint.every_frames=150",
]  # fmt: skip


def runs(tmp_path: Path) -> list:
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    return client.search_runs([client.get_experiment_by_name("rl_lightning").experiment_id])


@pytest.mark.slow
def test_a_multirun_runs_every_combination_as_its_own_tagged_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "-m", *QUICK, "seed=0,1"]) == 0
    found = runs(tmp_path)
    assert sorted(r.data.params["seed"] for r in found) == ["0", "1"]
    assert len({r.data.tags["sweep"] for r in found}) == 1 and {r.data.tags["sweep_job"] for r in found} == {
        "0",
        "1",
    }
    assert len({r.data.tags["run_dir"] for r in found}) == 2  # a run directory each
    assert all(r.info.status == "FINISHED" for r in found)


@pytest.mark.slow
def test_optuna_tunes_on_the_best_evaluation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    monkeypatch.chdir(tmp_path)
    overrides = [*QUICK, "+hparams_search=dqn_cartpole", "total_frames=300", "eval.every_frames=150",
                 "hydra.sweeper.n_trials=2", "hydra.sweep.dir=sweep"]  # fmt: skip
    assert main(["fit", "-m", *overrides]) == 0
    found = runs(tmp_path)
    assert len(found) == 2 and len({r.data.params["algo.lr"] for r in found}) == 2  # two sampled points
    result = yaml.safe_load((tmp_path / "sweep" / "optimization_results.yaml").read_text())
    best = max(float(r.data.tags["checkpoint.best_score"]) for r in found)
    assert result["best_value"] == pytest.approx(best)


def test_multirun_is_for_fit_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["evaluate", "-m", "ckpt=x.ckpt"]) == 2
    assert "sweeps over fit" in capsys.readouterr().err
