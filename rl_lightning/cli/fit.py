"""``python -m rl_lightning fit``: train the configured algorithm, or resume a run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.run import Run, build_run, container

__all__ = ["fit"]


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _record_config(run: Run) -> None:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    cfg_file = run.run_dir / "config.yaml"
    cfg_file.write_text(OmegaConf.to_yaml(run.cfg))
    if run.logger is None:
        return
    run.logger.log_hyperparams(_flatten(container(run.cfg)))
    run.logger.experiment.log_artifact(run.logger.run_id, str(cfg_file))
    (run.run_dir / "mlflow_run_id").write_text(run.logger.run_id)


def fit(cfg: DictConfig) -> Run:
    """Trains the configured algorithm; resumes when ``ckpt_path`` is set."""
    run = build_run(cfg)
    if run.ckpt_path is None:
        _record_config(run)
    else:
        print(f"resuming from {run.ckpt_path}")
    try:
        run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=run.ckpt_path)
    except SystemExit:
        # Lightning turns Ctrl-C into sys.exit(1) after the callbacks' on_exception (our checkpoint).
        if run.trainer.interrupted:
            print(
                f"interrupted: checkpoint saved in {run.run_dir / 'checkpoints'}; resume with ckpt_path=last"
            )
            raise KeyboardInterrupt from None
        raise
    ev = run.trainer.callback_metrics.get("eval/return_mean")
    summary = {
        "frames": run.datamodule.frames,
        "updates": run.datamodule.updates,
        "run_dir": str(run.run_dir),
    }
    if ev is not None:
        summary["eval/return_mean"] = round(float(ev), 3)
    print(json.dumps(summary))
    return run
