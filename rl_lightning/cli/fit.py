"""``python -m rl_lightning fit``: train the configured algorithm, or resume a run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.errors import USER_ERRORS
from rl_lightning.cli.process import end_startup_pause, stop_when_output_closes
from rl_lightning.cli.run import RUN_DIR_ENV, Run, build_run, container
from rl_lightning.envs.factory import env_modules
from rl_lightning.training.loggers import end_run, is_mlflow, record_file

__all__ = ["EXPERIMENT_KIND_TAG", "NOT_LOGGED", "fit"]

#: Root keys that are not part of a training run's configuration (other commands' settings, resuming).
NOT_LOGGED = (
    "bench", "doctor", "export", "plot", "report", "ui", "ckpt", "ckpt_path", "split", "episodes",
    "eval_seed", "video", "plan", "risk", "risk_param", "planner", "progress_bar", "progress_every_s",
    "logger",
)  # fmt: skip
#: MLflow 3's UI opens an experiment as a GenAI one unless this tag says it holds model training runs.
EXPERIMENT_KIND_TAG = ("mlflow.experimentKind", "custom_model_development")


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def training_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved training config, flattened (``algo.lr``, ...), without other commands' settings.

    Lists and empty mappings become their text (``[256, 256]``, ``{}``), so every key is one parameter.
    """
    data = {k: v for k, v in container(cfg).items() if k not in NOT_LOGGED}
    return {k: str(v) if isinstance(v, list | tuple | Mapping) else v for k, v in _flatten(data).items()}


def _mlflow(run: Run) -> Any:
    """The MLflow client of the run's logger (``None`` without one, or with another logger)."""
    return run.logger.experiment if is_mlflow(run.logger) else None


def _tag_experiment(client: Any, experiment_id: str) -> None:
    """Marks the experiment with ``EXPERIMENT_KIND_TAG`` unless it is; a run that started at the same moment
    and set it first makes MLflow's insert fail on the tag's unique key, which is then already right."""
    from mlflow.exceptions import MlflowException

    key, value = EXPERIMENT_KIND_TAG
    if client.get_experiment(experiment_id).tags.get(key) == value:
        return
    try:
        client.set_experiment_tag(experiment_id, key, value)
    except MlflowException:
        if client.get_experiment(experiment_id).tags.get(key) != value:
            raise


def _record_config(run: Run) -> None:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    cfg_file = run.run_dir / "config.yaml"
    cfg_file.write_text(OmegaConf.to_yaml(run.cfg))
    if run.logger is None:
        return
    client = _mlflow(run)
    if client is not None:
        _tag_experiment(client, run.logger.experiment_id)
    run.logger.log_hyperparams(training_params(run.cfg))
    record_file(run.logger, cfg_file, run.run_dir)
    if client is not None:
        client.set_tag(run.logger.run_id, "run_dir", str(run.run_dir))
        (run.run_dir / "mlflow_run_id").write_text(run.logger.run_id)


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def _score(value: float | None, frames: int | None, monitor: str) -> str:
    if value is None:
        return "not evaluated"
    return f"{monitor} {value:.2f} at {frames} frames"


def _report(run: Run, seconds: float, frames_before: int, interrupted: bool) -> dict[str, Any]:
    """Prints where the checkpoints are and what they scored; records the same as MLflow tags."""
    dm, ck = run.datamodule, run.checkpoint
    monitor = ck.monitor or "score"
    rate = (dm.frames - frames_before) / seconds if seconds > 0 else 0.0
    head = "interrupted" if interrupted else "done"
    print(f"{head}: {dm.frames} frames, {dm.updates} updates, {seconds:.0f} s ({rate:,.0f} frames/s)")
    summary: dict[str, Any] = {"frames": dm.frames, "updates": dm.updates, "run_dir": str(run.run_dir)}
    tags = {}
    if ck.last_path.is_file():
        print(
            f"last checkpoint: {_shown(ck.last_path)} ({_score(ck.last_score, ck.last_eval_frames, monitor)})"
        )
        summary["last_ckpt"] = str(ck.last_path)
        tags["checkpoint.last"] = str(ck.last_path.resolve())
    if ck.best_path.is_file():
        print(f"best checkpoint: {_shown(ck.best_path)} ({_score(ck.best_score, ck.best_frames, monitor)})")
        modules = env_modules(run.datamodule.env_cfg)  # a checkpoint imports the user's env when named
        named = f" env.packages=[{','.join(modules)}]" if modules else ""
        print(f"  evaluate it:   python -m rl_lightning evaluate ckpt={_shown(ck.best_path)}{named}")
        summary.update(best_ckpt=str(ck.best_path), best_score=ck.best_score, best_frames=ck.best_frames)
        tags.update({"checkpoint.best": str(ck.best_path.resolve()), "checkpoint.best_score": ck.best_score})
    if interrupted:
        print("resume with: the same command and ckpt_path=last")
    ev = run.trainer.callback_metrics.get("eval/return_mean")
    if ev is not None:
        summary["eval/return_mean"] = round(float(ev), 3)
    client = _mlflow(run)
    if client is not None:
        for key, value in tags.items():
            client.set_tag(run.logger.run_id, key, str(value))
        if interrupted:
            client.set_terminated(run.logger.run_id, "KILLED")
    return summary


def _discard(run: Run) -> None:
    """Removes what a run that failed before its first checkpoint wrote (its directory, its MLflow run)."""
    shutil.rmtree(run.run_dir, ignore_errors=True)  # the file loggers' records too
    if is_mlflow(run.logger):
        run.logger.experiment.delete_run(run.logger.run_id)


def fit(cfg: DictConfig) -> Run:
    """Trains the configured algorithm; resumes when ``ckpt_path`` is set.

    Ctrl-C or SIGTERM stops the run at the next safe point with a resumable ``last.ckpt`` (its MLflow run is
    marked KILLED, and FINISHED again when a resume completes); the command then raises ``KeyboardInterrupt``.
    """
    run = build_run(cfg, claim_run_dir=True)
    main_rank = run.trainer.is_global_zero  # the other ranks of a DDP run train and save, and say nothing
    algo = type(run.module).__name__
    device = run.device
    ranks = run.trainer.world_size
    if main_rank:
        print(
            f"fit {cfg.name}: {algo} on {run.datamodule.env_cfg.id}, {cfg.total_frames} frames, seed "
            f"{cfg.seed}, {device.type}{f' x {ranks} ranks' if ranks > 1 else ''} -> {_shown(run.run_dir)}"
        )
        if cfg.get("cpu_variant") and device.type == "cpu":
            print(
                f"note: {cfg.name} is sized for a GPU and runs slowly on a CPU; "
                f"+experiment={cfg.cpu_variant} is the CPU-sized variant."
            )
    new_run = run.ckpt_path is None
    created = run.created or (new_run and not run.run_dir.exists())
    if main_rank:
        if new_run:
            _record_config(run)
        else:
            print(f"resuming from {_shown(Path(run.ckpt_path))}")
    if ranks > 1:
        # The ranks Lightning launches compose the config again (a new ${now}): they take this run directory.
        os.environ[RUN_DIR_ENV] = str(run.run_dir)
    end_startup_pause()  # the run is built: what it is made of lives until the process ends
    start = time.perf_counter()
    with stop_when_output_closes(run.stop.request):  # a closed pipe for output stops the run, with its ckpt
        try:
            run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=run.ckpt_path, weights_only=True)
        except SystemExit:
            # A second Ctrl-C: Lightning saved what it could (on_exception) and exits, leaving Ctrl-C ignored.
            if run.trainer.interrupted:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                if main_rank:
                    if is_mlflow(run.logger):
                        _mlflow(run).set_terminated(run.logger.run_id, "KILLED")
                    where = _shown(run.checkpoint.dirpath)
                    print(f"aborted: the last checkpoint is in {where}; resume with ckpt_path=last")
                raise KeyboardInterrupt from None
            raise
        except USER_ERRORS:
            if main_rank and created and not run.checkpoint.last_path.is_file():
                _discard(run)
            raise
        if main_rank:
            elapsed = time.perf_counter() - start
            summary = _report(run, elapsed, run.datamodule.resumed_frames, run.stop.requested)
            print(json.dumps(summary))
            end_run(run.logger)
    if run.stop.requested:
        raise KeyboardInterrupt
    return run
