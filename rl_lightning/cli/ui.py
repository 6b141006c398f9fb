"""``python -m rl_lightning ui``: MLflow's UI on this directory's runs, opened on their return curves.

MLflow 3 opens an experiment in its GenAI view (traces, token usage, a run under "Evaluations") unless told
otherwise, whatever the experiment's ``mlflow.experimentKind`` tag says: the UI keeps a workflow type of its
own, which its address sets (``workflowType=machine_learning``). The address printed here opens the
experiment's runs in that view, as charts of their metrics against frames (``compareRunsMode=CHART``);
the UI remembers the view for the next visits.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

from omegaconf import DictConfig

from rl_lightning.cli.config import CliError
from rl_lightning.cli.run import tracking_uri

__all__ = ["runs_address", "ui"]

#: The MLflow experiment page of the runs as charts, in the "Machine learning" workflow.
RUNS_PAGE = "#/experiments/{id}/runs?workflowType=machine_learning&compareRunsMode=CHART"


def runs_address(host: str, port: int, experiment_id: str | None) -> str:
    """The address that opens ``experiment_id``'s runs as charts (the experiments list without one)."""
    base = f"http://{host}:{port}/"
    return base + RUNS_PAGE.format(id=experiment_id) if experiment_id is not None else base


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
    print(f"MLflow UI on {uri}")
    if experiment is None:
        print(f"no run of experiment '{cfg.logger.experiment_name}' there yet; the experiments: ", end="")
    print(f"open {runs_address(host, port, experiment)}", flush=True)
    if cfg.ui.dry_run:
        return None
    mlflow_cli = shutil.which("mlflow")
    command = [mlflow_cli] if mlflow_cli else [sys.executable, "-m", "mlflow"]
    command += ["ui", "--backend-store-uri", uri, "--host", host, "--port", str(port)]
    try:
        return subprocess.run(command, check=False).returncode
    except KeyboardInterrupt:
        return 0
