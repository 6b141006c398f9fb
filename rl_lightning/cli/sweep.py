"""``python -m rl_lightning fit -m ...``: Hydra multirun sweeps over ``fit``.

Every other command composes its config with Hydra's compose API; a sweep hands the overrides to Hydra's
own entry point (``hydra.main``), so Hydra's sweepers and launchers do the work: the basic sweeper runs
every combination of comma-separated values (``seed=0,1,2 algo.lr=0.001,0.003``), and the Optuna sweeper
(``pip install 'rl_lightning[sweep]'``, ``+hparams_search=dqn_cartpole``) tunes keys on the best evaluation
score. Each job is a full ``fit`` in its own run directory (``<run_dir>_<job number>``) and its own MLflow
run, tagged ``sweep`` (the sweep's directory name, shared by its jobs) and ``sweep_job``. A job returns
its best ``checkpoint.monitor`` score, which is what the Optuna sweeper optimizes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rl_lightning.cli.config import CONF_DIR

__all__ = ["multirun"]


def _job(cfg: DictConfig) -> float | None:
    """One job of the sweep: ``fit`` with a run directory and MLflow tags of its own."""
    from hydra.core.hydra_config import HydraConfig

    from rl_lightning.cli.fit import fit

    hydra = HydraConfig.get()
    sweep = Path(hydra.sweep.dir).name
    num = hydra.job.num
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    with open_dict(cfg):
        cfg.run_dir = f"{cfg.run_dir}_{num}"
        if cfg.logger and cfg.logger.type == "mlflow":
            cfg.logger.tags = {**(cfg.logger.get("tags") or {}), "sweep": sweep, "sweep_job": str(num)}
    run = fit(cfg)
    score = run.checkpoint.best_score
    return None if score is None else float(score)


def multirun(overrides: Sequence[str]) -> int:
    """Runs the sweep that ``overrides`` describe; returns the exit code."""
    import hydra

    from rl_lightning.cli.process import quiet_libraries

    task = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(_job)
    argv = sys.argv
    sys.argv = [argv[0], *overrides, "--multirun"]
    restore = quiet_libraries()
    try:
        task()
    except SystemExit as e:  # Hydra exits on errors after printing them
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    finally:
        sys.argv = argv
        restore()
    return 0
