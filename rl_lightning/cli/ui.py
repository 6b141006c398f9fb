"""``python -m rl_lightning ui``: MLflow's UI on this directory's runs, opened on their return curves.

MLflow 3 opens an experiment in its GenAI view (traces, token usage, a run under "Evaluations") unless told
otherwise, whatever the experiment's ``mlflow.experimentKind`` tag says: the UI keeps a workflow type of its
own in the browser's local storage, and an address with ``workflowType=machine_learning`` only lasts until
the next click. ``ui`` serves MLflow's tracking server with one page more
(:mod:`rl_lightning.training.mlflow_app`, the MLflow app plugin ``rl_lightning``) that stores the
model-training view and opens the experiment's runs as charts of their metrics against frames; every page
reached from there keeps that view. The address is printed once the server answers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import urllib.request
from typing import Any

from omegaconf import DictConfig

from rl_lightning.cli.config import CliError
from rl_lightning.cli.run import tracking_uri

__all__ = ["runs_address", "ui"]

#: The page of the app plugin that keeps the model-training view and opens an experiment's runs as charts.
RUNS_PAGE = "rl-lightning/experiments/{id}"
#: How long the server may take to answer before ``ui`` gives up (MLflow's start imports a lot).
START_TIMEOUT_S = 180.0


def runs_address(host: str, port: int, experiment_id: str | None) -> str:
    """The address that opens ``experiment_id``'s runs as charts (the experiments list without one)."""
    base = f"http://{host}:{port}/"
    return base + RUNS_PAGE.format(id=experiment_id) if experiment_id is not None else base


def wait_until_answering(host: str, port: int, process: subprocess.Popen, timeout_s: float) -> bool:
    """Polls the server's ``/health`` until it answers (True) or ``process`` ends or time runs out."""
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/health"
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            time.sleep(0.5)
    return False


def _experiment_id(uri: str, name: str) -> str | None:
    """The id of the experiment ``name`` in the store ``uri`` (``None``: no run recorded there yet)."""
    import mlflow

    from rl_lightning.training.mlflow_store import prepare_sqlite_store

    prepare_sqlite_store(uri)  # an empty store, as a first fit would make it
    experiment = mlflow.MlflowClient(tracking_uri=uri).get_experiment_by_name(name)
    return experiment.experiment_id if experiment is not None else None


def ui(cfg: DictConfig) -> Any:
    """Prints the address of the runs' curves and serves MLflow's UI on the run store until Ctrl-C.

    The store is ``logger.tracking_uri`` (by default ``mlflow.db`` of the current directory) and the
    experiment ``logger.experiment_name``; ``ui.host`` and ``ui.port`` say where to serve.
    """
    if not cfg.logger or cfg.logger.type != "mlflow":
        raise CliError(
            "ui shows the MLflow runs (logger=mlflow); runs logged with logger=tensorboard open with "
            "`tensorboard --logdir runs`, logger=csv ones are runs/<name>/<time>/csv/metrics.csv."
        )
    uri = tracking_uri(cfg.logger.tracking_uri)
    host, port = str(cfg.ui.host), int(cfg.ui.port)
    experiment = _experiment_id(uri, str(cfg.logger.experiment_name))
    address = runs_address(host, port, experiment)
    print(f"MLflow UI on {uri}")
    if experiment is None:
        print(f"no run of experiment '{cfg.logger.experiment_name}' there yet; the experiments are at:")
    if cfg.ui.dry_run:
        print(f"open {address}", flush=True)
        return None
    mlflow_cli = shutil.which("mlflow")
    command = [mlflow_cli] if mlflow_cli else [sys.executable, "-m", "mlflow"]
    command += ["server", "--backend-store-uri", uri, "--host", host, "--port", str(port),
                "--app-name", "rl_lightning", "--workers", "1"]  # fmt: skip
    print("starting the server...", flush=True)
    process = subprocess.Popen(command)
    try:
        if not wait_until_answering(host, port, process, START_TIMEOUT_S):
            process.terminate()
            raise CliError(
                f"the MLflow server did not answer on {host}:{port} within {START_TIMEOUT_S:.0f} s (its "
                "output is above); is the port taken? ui.port=... chooses another."
            )
        print(f"open {address}", flush=True)
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return 0
