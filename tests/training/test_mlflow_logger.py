"""The MLflow logger of a run: metrics kept in memory and written in batches, none lost at the end."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rl_lightning.training.mlflow_logger import MAX_METRICS_PER_BATCH, BufferedMLFlowLogger, live_history

MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient


def _logger(tmp_path: Path, flush_every_s: float) -> tuple[BufferedMLFlowLogger, list[int]]:
    """A logger on a SQLite store in ``tmp_path`` and the sizes of the ``log_batch`` calls it makes."""
    logger = BufferedMLFlowLogger(
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment_name="test", flush_every_s=flush_every_s
    )
    client, sizes = logger.experiment, []
    write = client.log_batch

    def counted(run_id: str, metrics: list, **kwargs) -> None:
        sizes.append(len(metrics))
        write(run_id, metrics=metrics, **kwargs)

    client.log_batch = counted
    return logger, sizes


def _history(logger: BufferedMLFlowLogger, key: str) -> list[tuple[int, float]]:
    client = MlflowClient(logger._tracking_uri)
    return sorted((m.step, m.value) for m in client.get_metric_history(logger.run_id, key))


def test_metrics_are_written_together_when_the_run_ends(tmp_path: Path) -> None:
    logger, sizes = _logger(tmp_path, flush_every_s=3600)
    for i in range(5):
        logger.log_metrics({"train/loss": 0.5 * i, "time/frames": 10.0 * i}, step=10 * i)
    assert sizes == [] and _history(logger, "train/loss") == []  # kept in memory
    logger.finalize("success")
    assert sizes == [10]
    assert _history(logger, "train/loss") == [(10 * i, 0.5 * i) for i in range(5)]
    assert MlflowClient(logger._tracking_uri).get_run(logger.run_id).info.status == "FINISHED"


def test_metrics_are_written_once_the_interval_has_passed(tmp_path: Path) -> None:
    logger, sizes = _logger(tmp_path, flush_every_s=60)
    # The interval is counted from the last write (here: now, the run being created); moving that moment
    # back stands in for the minute passing, so a slow machine cannot make the first calls due already.
    logger._last_flush = time.monotonic()
    logger.log_metrics({"a": 1.0}, step=1)
    logger.log_metrics({"a": 2.0}, step=2)
    logger._last_flush -= 61
    logger.log_metrics({"a": 3.0}, step=3)
    assert sizes == [3] and _history(logger, "a") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    logger.log_metrics({"a": 4.0}, step=4)
    logger.finalize("failed")  # an interrupted or failed fit keeps what it logged too
    assert sizes == [3, 1] and _history(logger, "a")[-1] == (4, 4.0)


def test_zero_interval_writes_every_call_and_a_full_batch_goes_at_once(tmp_path: Path) -> None:
    logger, sizes = _logger(tmp_path, flush_every_s=0)
    logger.log_metrics({"a": 1.0, "skipped": "text"}, step=1)
    assert sizes == [1]
    slow, slow_sizes = _logger(tmp_path, flush_every_s=3600)
    slow.log_metrics({f"m{i}": float(i) for i in range(MAX_METRICS_PER_BATCH + 1)}, step=0)
    assert slow_sizes == [MAX_METRICS_PER_BATCH, 1]


@pytest.mark.parametrize("bad", [-1, "5", True])
def test_a_bad_interval_is_refused(tmp_path: Path, bad) -> None:
    with pytest.raises(ValueError, match="flush_every_s"):
        BufferedMLFlowLogger(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", flush_every_s=bad)


def test_metrics_logged_before_the_run_starts_are_kept(tmp_path: Path) -> None:
    logger = BufferedMLFlowLogger(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", flush_every_s=3600)
    logger.log_metrics({"a": 1.0}, step=7)  # the MLflow run does not exist yet
    logger.finalize("success")
    assert _history(logger, "a") == [(7, 1.0)]


def test_a_run_that_loses_the_race_to_make_the_experiment_takes_the_one_made(tmp_path: Path) -> None:
    # Runs started at the same moment in a new store both look the experiment up, find none, and make it.
    logger = BufferedMLFlowLogger(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment_name="shared")
    other = MlflowClient(logger._tracking_uri)
    look = logger._mlflow_client.get_experiment_by_name
    made: list[str] = []

    def the_other_makes_it_meanwhile(name: str):
        found = look(name)
        if not made:
            made.append(other.create_experiment(name))
        return found

    logger._mlflow_client.get_experiment_by_name = the_other_makes_it_meanwhile
    logger.experiment  # noqa: B018 (creates the run)
    assert made and logger.experiment_id == made[0]
    assert other.get_run(logger.run_id).info.experiment_id == made[0]


def test_the_experiment_kind_tag_set_meanwhile_by_another_run_is_no_error(tmp_path: Path) -> None:
    from rl_lightning.cli.fit import EXPERIMENT_KIND_TAG, _tag_experiment

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    experiment_id = client.create_experiment("shared")
    read = client.get_experiment
    calls: list[int] = []

    def the_other_tags_it_after_this_read(eid: str):
        found = read(eid)
        if not calls:
            MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").set_experiment_tag(eid, *EXPERIMENT_KIND_TAG)
        calls.append(1)
        return found

    client.get_experiment = the_other_tags_it_after_this_read
    _tag_experiment(client, experiment_id)
    assert read(experiment_id).tags[EXPERIMENT_KIND_TAG[0]] == EXPERIMENT_KIND_TAG[1]


def test_the_history_of_a_resumed_run_leaves_out_what_its_lost_part_logged(tmp_path: Path) -> None:
    """Logged to frame 40 with a checkpoint at 20, killed, resumed from 20 and run to 50: the history is
    the resumed run's from 20 on (its values, once each), and the first part's before 20."""
    from mlflow.entities import Metric

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run_id = client.create_run(client.create_experiment("resume")).info.run_id
    first = [(10, 1.0), (20, 2.0), (20, 2.5), (30, 3.0), (40, 4.0)]  # two records at 20: equal steps stay
    resumed = [(20, -2.0), (30, -3.0), (40, -4.0), (50, -5.0)]
    t = 1_000_000
    records = [Metric("m", value, t + i, step) for i, (step, value) in enumerate(first)]
    records += [Metric("m", value, t + 1000 + i, step) for i, (step, value) in enumerate(resumed)]
    client.log_batch(run_id, metrics=records)
    history = live_history(client.get_metric_history(run_id, "m"))
    assert [(m.step, m.value) for m in history] == [(10, 1.0), (20, -2.0), (30, -3.0), (40, -4.0), (50, -5.0)]
    # Without a resume, the history is every record, in order.
    uninterrupted = live_history([Metric("m", v, t + i, s) for i, (s, v) in enumerate(first)])
    assert [(m.step, m.value) for m in uninterrupted] == first
