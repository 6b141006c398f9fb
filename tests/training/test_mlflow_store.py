"""A new SQLite MLflow store copied from an empty one: the same store MLflow makes with its migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import rl_lightning.training.mlflow_store as store
from rl_lightning.training.mlflow_logger import BufferedMLFlowLogger

MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "rl_lightning"


def _dump(path: Path) -> list[list[str]]:
    """The schema and rows of a SQLite file, statement by statement, with the Default experiment's times out.

    MLflow's migrations recreate some tables with their constraints in an order that changes from one
    process to the next (two stores it makes itself differ so), so the clauses of each statement are
    compared as a sorted list.
    """
    con = sqlite3.connect(path)
    try:
        statements = list(con.iterdump())
        times = con.execute("SELECT creation_time, last_update_time FROM experiments").fetchall()
    finally:
        con.close()
    for t in {str(v) for row in times for v in row}:
        statements = [s.replace(t, "<time>") for s in statements]
    return sorted(sorted(line.strip().rstrip(",") for line in s.splitlines()) for s in statements)


@pytest.mark.slow
def test_a_copied_store_is_the_store_mlflow_makes(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns of the process
    own = MlflowClient(f"sqlite:///{tmp_path}/own.db").get_experiment("0")  # MLflow's migrations
    assert store.prepare_sqlite_store(f"sqlite:///{tmp_path}/copied.db")
    assert len(list(cache.glob("mlflow-*.db"))) == 1
    # The Default experiment is made by MLflow when it opens the copy, with the artifact root of then.
    copied = MlflowClient(f"sqlite:///{tmp_path}/copied.db").get_experiment("0")
    assert copied.name == own.name == "Default"
    assert copied.artifact_location == own.artifact_location == str(tmp_path / "mlruns" / "0")
    assert _dump(tmp_path / "copied.db") == _dump(tmp_path / "own.db")


def test_the_logger_starts_a_new_store_from_the_template_and_runs_on_it(tmp_path: Path, cache: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        logger = BufferedMLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / name}/mlflow.db", flush_every_s=0)
        logger.log_metrics({"train/loss": 1.5}, step=3)
        logger.finalize("success")
        client = MlflowClient(f"sqlite:///{tmp_path / name}/mlflow.db")
        history = client.get_metric_history(logger.run_id, "train/loss")
        assert [(m.step, m.value) for m in history] == [(3, 1.5)]
    assert len(list(cache.glob("mlflow-*.db"))) == 1  # made once, copied twice


def test_existing_stores_and_other_uris_are_left_alone(tmp_path: Path, cache: Path) -> None:
    existing = tmp_path / "mlflow.db"
    existing.write_bytes(b"not touched")
    for uri in (
        f"sqlite:///{existing}",
        f"sqlite:///{tmp_path}/missing_dir/mlflow.db",  # MLflow reports the missing directory
        "sqlite:///:memory:",
        f"sqlite:///{tmp_path}/opts.db?mode=ro",
        f"file://{tmp_path}/mlruns",
        "http://localhost:5000",
    ):
        assert not store.prepare_sqlite_store(uri), uri
    assert existing.read_bytes() == b"not touched"
    assert not (tmp_path / "opts.db").exists() and not cache.exists()


def test_a_failing_template_leaves_the_store_to_mlflow(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(engine: object) -> None:
        raise RuntimeError("migrations moved")

    monkeypatch.setattr("mlflow.store.db.utils._initialize_tables", broken)
    assert not store.prepare_sqlite_store(f"sqlite:///{tmp_path}/mlflow.db")
    assert not (tmp_path / "mlflow.db").exists() and not list(cache.glob("*"))
    monkeypatch.undo()
    assert MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_experiment("0").name == "Default"


def test_a_store_made_meanwhile_by_another_process_is_kept(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mlflow.db"
    real_copy = store.shutil.copyfile

    def copy_then_race(src: Path, dst: str) -> None:
        real_copy(src, dst)
        path.write_bytes(b"the other process's store")

    monkeypatch.setattr(store.shutil, "copyfile", copy_then_race)
    assert not store.prepare_sqlite_store(f"sqlite:///{path}")
    assert path.read_bytes() == b"the other process's store"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
