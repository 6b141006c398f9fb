"""The run's logger: MLflow (the default), TensorBoard, Weights & Biases (offline) or CSV, all Lightning's.

Every logger gets the same records: metrics against environment frames (the ``step`` of every
``log_metrics`` call is the frame count), the resolved config flattened into hyperparameters, and the
config file itself (MLflow: an artifact; TensorBoard and CSV: a copy in their log folder; W&B: a file of
the run). MLflow's store is shared by every run of a directory (``logger.tracking_uri``); the others
write into the run's own directory (``runs/<name>/<time>/tensorboard``, ``csv``, ``wandb``), so a resumed
run continues in the same place. W&B runs offline unless ``logger.mode=online``: no account, no network;
``wandb sync`` uploads an offline run later.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger, TensorBoardLogger, WandbLogger

from rl_lightning.compat import wandb_run_started
from rl_lightning.training.mlflow_logger import BufferedMLFlowLogger

__all__ = ["LOGGER_TYPES", "build_logger", "end_run", "is_mlflow", "record_file"]

#: ``logger.type`` -> the extra to install for it (``None``: always there).
LOGGER_TYPES = {"mlflow": None, "tensorboard": "tensorboard", "wandb": "wandb", "csv": None}
#: The file in a run's directory that remembers its W&B run, so a resume continues it.
WANDB_ID_FILE = "wandb_run_id"


def is_mlflow(logger: Logger | None) -> bool:
    return isinstance(logger, MLFlowLogger)


def build_logger(lcfg: dict[str, Any], run_dir: Path, tracking_uri: str | None = None) -> Logger:
    """The logger of a ``logger`` config node (plain values, ``type`` among :data:`LOGGER_TYPES`).

    Args:
        lcfg: the node's keys; ``type`` picks the logger, the rest are its settings.
        run_dir: the run's directory (the file loggers write there; MLflow continues the run named in it).
        tracking_uri: MLflow's store, resolved.

    Raises:
        ValueError: an unknown type, or the package a logger needs is missing (one line that says what to
            install).
    """
    lcfg = dict(lcfg)
    kind = lcfg.pop("type", "mlflow")
    if kind not in LOGGER_TYPES:
        raise ValueError(f"logger.type={kind!r}: choose one of {', '.join(LOGGER_TYPES)} (or logger=none).")
    if kind == "mlflow":
        run_id_file = run_dir / "mlflow_run_id"
        run_id = run_id_file.read_text().strip() if run_id_file.is_file() else None
        artifacts = lcfg.pop("artifact_location", None)
        return BufferedMLFlowLogger(
            tracking_uri=tracking_uri,
            artifact_location=str(Path(artifacts).resolve()) if artifacts else None,
            run_id=run_id,
            **{k: v for k, v in lcfg.items() if k != "tracking_uri"},
        )
    _require(kind)
    if kind == "tensorboard":
        return TensorBoardLogger(
            save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False
        )
    if kind == "csv":
        return CSVLogger(save_dir=str(run_dir), name="csv", version="")
    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else None
    offline = lcfg["mode"] == "offline"
    return WandbLogger(
        project=lcfg["project"], name=lcfg["run_name"], save_dir=str(run_dir), offline=offline, id=run_id,
        resume="allow" if run_id else None,
    )  # fmt: skip


def _require(kind: str) -> None:
    import importlib.util

    package = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(kind)
    if package is not None and importlib.util.find_spec(package) is None:
        raise ValueError(
            f"logger={kind} needs the {package} package: pip install 'rl_lightning[{LOGGER_TYPES[kind]}]'."
        )


def record_file(logger: Logger, path: Path, run_dir: Path) -> None:
    """Keeps ``path`` (the resolved config) with the logger's records: an MLflow artifact, a file of the W&B
    run, a copy in the TensorBoard or CSV log folder. A W&B run's id is kept in ``run_dir`` for a resume."""
    if is_mlflow(logger):
        logger.experiment.log_artifact(logger.run_id, str(path))
    elif isinstance(logger, WandbLogger):
        # Under the run folder's name: W&B's own config.yaml of the run sits at the top of its files.
        logger.experiment.save(str(path), base_path=str(path.parent.parent), policy="now")
        (run_dir / WANDB_ID_FILE).write_text(logger.experiment.id)
    else:
        log_dir = Path(logger.log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, log_dir / path.name)


def end_run(logger: Logger | None) -> None:
    """Ends a W&B run with the fit (Lightning leaves it to the interpreter's exit, so a process that goes
    on, a sweep's next job or a test, would leave it open, its summary unwritten); the others end with
    Lightning's ``finalize``."""
    if isinstance(logger, WandbLogger) and wandb_run_started(logger):
        logger.experiment.finish()
