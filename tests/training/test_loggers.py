"""Every logger records a quick fit: metrics against frames and the resolved config, read back from its files.

``logger=tensorboard`` (event files), ``logger=csv`` (``metrics.csv`` and ``hparams.yaml``) and
``logger=wandb`` (an offline run: no account, no network) each get a 400-frame DQN fit with an evaluation at
200 and 400 frames through the real CLI; MLflow's records are checked in ``tests/cli/test_cli_runs.py``.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from rl_lightning.cli import main

QUICK = (
    "fit", "+experiment=dqn_cartpole", "device=cpu", "progress_bar=false", "total_frames=400",
    "collect.warmup_frames=100", "collect.frames_per_batch=50", "eval.every_frames=200", "eval.episodes=2",
    "algo.hidden_sizes=[16,16]",
)  # fmt: skip


def quick_fit(tmp_path: Path, monkeypatch, logger: str) -> Path:
    """Runs the quick fit with ``logger`` in ``tmp_path``; returns the run's directory."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    assert main([*QUICK, f"logger={logger}"]) == 0
    (run_dir,) = tmp_path.glob("runs/dqn_cartpole/*")
    assert not (tmp_path / "mlflow.db").exists()  # nothing in MLflow's store
    return run_dir


def test_tensorboard_records_metrics_against_frames_and_the_config(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = quick_fit(tmp_path, monkeypatch, "tensorboard")
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/return_mean")] == [200, 400]
    assert (run_dir / "tensorboard" / "config.yaml").is_file()
    hparams = yaml.safe_load((run_dir / "tensorboard" / "hparams.yaml").read_text())
    assert hparams["algo.lr"] == 0.0023 and hparams["total_frames"] == 400


def test_csv_records_metrics_against_frames_and_the_config(tmp_path: Path, monkeypatch) -> None:
    run_dir = quick_fit(tmp_path, monkeypatch, "csv")
    with (run_dir / "csv" / "metrics.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r.get("eval/return_mean")]
    assert [int(r["step"]) for r in rows] == [200, 400]
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert hparams["algo.hidden_sizes"] == "[16, 16]" and hparams["seed"] == 0
    assert (run_dir / "csv" / "config.yaml").read_text() == (run_dir / "config.yaml").read_text()


@pytest.mark.slow
def test_wandb_records_an_offline_run_against_frames(tmp_path: Path, monkeypatch) -> None:
    """An offline W&B run keeps its records in a binary log (``wandb sync`` uploads it): they are read back
    from the run itself, as W&B summarises them, just before the fit ends it."""
    pytest.importorskip("wandb")
    import rl_lightning.cli.fit as fit_module

    seen = {}
    end_run = fit_module.end_run

    def read_then_end(logger) -> None:
        seen.update(summary=dict(logger.experiment.summary), config=dict(logger.experiment.config))
        end_run(logger)

    monkeypatch.setattr(fit_module, "end_run", read_then_end)
    run_dir = quick_fit(tmp_path, monkeypatch, "wandb")
    assert seen["summary"]["trainer/global_step"] == 400 and "eval/return_mean" in seen["summary"]
    assert seen["config"]["total_frames"] == 400 and seen["config"]["algo.lr"] == 0.0023
    (log,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    assert log.stat().st_size > 0 and (run_dir / "wandb_run_id").read_text() in log.name
    # The resolved config file is one of the run's files, under the run folder's name.
    assert (log.parent / "files" / run_dir.name / "config.yaml").is_file()
