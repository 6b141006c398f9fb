"""The commands behind the CLI: building a run from the config, ``fit`` and ``evaluate``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.loggers import MLFlowLogger
from omegaconf import DictConfig, OmegaConf

from rl_lightning.algos.base import IncompatibleEnvError, RLModule
from rl_lightning.checkpoint import FrameCheckpoint, replay_path
from rl_lightning.data.datamodule import CollectConfig, RLDataModule
from rl_lightning.data.replay import ReplayConfig, resolve_device
from rl_lightning.envs.factory import EnvConfig, UnknownEnvError, make_env
from rl_lightning.evaluation import EvalCallback, evaluate_variants
from rl_lightning.progress import FramesProgressBar

__all__ = ["EXTRA_COMMANDS", "EXTRA_HELP", "USER_ERRORS", "Run", "build_run", "evaluate", "fit"]

#: Exceptions that are the user's to fix: the CLI prints them as one line.
USER_ERRORS: tuple[type[BaseException], ...] = (
    UnknownEnvError,
    IncompatibleEnvError,
    FileNotFoundError,
    ValueError,
)

#: Further commands (name -> callable(cfg)), and their help lines. Their modules import this one, so the
#: entries import them on call.
EXTRA_COMMANDS: dict[str, Callable[[DictConfig], Any]] = {}
EXTRA_HELP: dict[str, str] = {}


def _bench(cfg: DictConfig) -> Any:
    from rl_lightning.bench import bench

    return bench(cfg)


def _doctor(cfg: DictConfig) -> Any:
    from rl_lightning.doctor import doctor

    return doctor(cfg)


EXTRA_COMMANDS.update(bench=_bench, doctor=_doctor)
EXTRA_HELP.update(
    bench="speed of each callback against none: python -m rl_lightning bench +experiment=dqn_cartpole\n"
    "             [bench.frames=N] [bench.variants=[compile,fast]] [bench.out=PATH]",
    doctor="what this machine offers (CUDA, TF32, torch.compile, threads, versions) and advice",
)

CONFIG_KEY = "rl_lightning"


def _container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def env_config(cfg: DictConfig) -> EnvConfig:
    return EnvConfig.from_mapping(_container(cfg.env))


def build_module(cfg: DictConfig, env_cfg: EnvConfig) -> RLModule:
    """Instantiates ``cfg.algo`` with the specs of the env (derived, never typed into the config)."""
    probe = make_env(env_cfg, num_envs=1)
    try:
        # Specs are objects, not config: bind them after instantiation so OmegaConf never sees them.
        factory = instantiate(cfg.algo, _partial_=True, _convert_="all")
        module = factory(
            observation_spec=probe.full_observation_spec.clone(),
            action_spec=probe.full_action_spec["action"].clone(),
        )
    finally:
        probe.close()
    return module


@dataclass
class Run:
    """Everything ``fit`` needs, built from one config."""

    cfg: DictConfig
    run_dir: Path
    module: RLModule
    datamodule: RLDataModule
    trainer: L.Trainer
    logger: MLFlowLogger | None
    ckpt_path: str | None


def _find_last(name: str, runs_root: Path) -> Path:
    found = sorted(runs_root.glob(f"{name}/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(
            f"ckpt_path=last: no checkpoint of a run named '{name}' under {runs_root}/{name}/; "
            "start a run first or pass ckpt_path=PATH."
        )
    return found[-1]


def _resolve_resume(cfg: DictConfig) -> tuple[Path, str | None]:
    """The run directory and the checkpoint to resume from (``None`` for a new run)."""
    run_dir = Path(cfg.run_dir)
    if cfg.ckpt_path is None:
        return run_dir, None
    if cfg.ckpt_path == "last":
        ckpt = _find_last(cfg.name, run_dir.parent.parent)
    else:
        ckpt = Path(cfg.ckpt_path)
        if not ckpt.is_file():
            raise FileNotFoundError(f"checkpoint not found: {ckpt}")
    # A checkpoint of ours lives in <run_dir>/checkpoints/: the resumed run continues in that directory.
    if ckpt.parent.name == "checkpoints":
        run_dir = ckpt.parent.parent
    return run_dir, str(ckpt)


def _make_logger(cfg: DictConfig, run_dir: Path) -> MLFlowLogger | None:
    if not cfg.logger:
        return None
    lcfg = _container(cfg.logger)
    uri = lcfg.pop("tracking_uri")
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    artifacts = lcfg.pop("artifact_location", None)
    run_id_file = run_dir / "mlflow_run_id"
    run_id = run_id_file.read_text().strip() if run_id_file.is_file() else None
    return MLFlowLogger(
        tracking_uri=uri,
        artifact_location=str(Path(artifacts).resolve()) if artifacts else None,
        run_id=run_id,
        **lcfg,
    )


def _callbacks(cfg: DictConfig, env_cfg: EnvConfig, run_dir: Path) -> list[L.Callback]:
    callbacks: list[L.Callback] = [
        EvalCallback(
            env_cfg,
            every_frames=cfg.eval.every_frames,
            episodes=cfg.eval.episodes,
            seed=cfg.eval.seed,
            variants=_container(cfg.eval.variants),
        ),
        FrameCheckpoint(
            every_frames=cfg.checkpoint.every_frames,
            dirpath=str(run_dir / "checkpoints"),
            filename="best",
            enable_version_counter=False,
            monitor=cfg.checkpoint.monitor,
            mode=cfg.checkpoint.mode,
            save_top_k=1,
        ),
        _ConfigInCheckpoint(_container(cfg)),
    ]
    if cfg.progress_bar:
        callbacks.append(FramesProgressBar())
    for name, node in (cfg.callbacks or {}).items():
        if node is None:
            continue
        if "_target_" not in node:
            raise ValueError(
                f"callbacks.{name} has no _target_; set it or disable it with callbacks.{name}=null."
            )
        callbacks.append(instantiate(node, _convert_="all"))
    return callbacks


class _ConfigInCheckpoint(L.Callback):
    """Stores the resolved config in every checkpoint so ``evaluate`` can rebuild the run from it."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.config = config

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict) -> None:
        checkpoint[CONFIG_KEY] = {"config": self.config}


def apply_process_settings(cfg: DictConfig) -> None:
    """Process-wide settings of a command (the CLI owns them; library code never changes them)."""
    threads = cfg.get("torch_threads")
    if threads is not None:
        if int(threads) < 1:
            raise ValueError("torch_threads must be >= 1 or null (torch's default).")
        torch.set_num_threads(int(threads))


def build_run(cfg: DictConfig) -> Run:
    """Builds module, data module, trainer and logger from the composed config."""
    apply_process_settings(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    run_dir, ckpt = _resolve_resume(cfg)
    env_cfg = env_config(cfg)
    device = resolve_device(cfg.device)
    module = build_module(cfg, env_cfg)
    replay_cfg = ReplayConfig(**_container(cfg.replay))
    collect = CollectConfig(total_frames=cfg.total_frames, **_container(cfg.collect))
    gamma = float(cfg.algo.get("gamma", 0.99))
    datamodule = RLDataModule(env_cfg, replay_cfg, collect, seed=cfg.seed, gamma=gamma)
    if ckpt is not None:
        datamodule.resume_replay_from = str(replay_path(ckpt))
    logger = _make_logger(cfg, run_dir)
    trainer = L.Trainer(
        accelerator=device.type,
        devices=1,
        max_epochs=-1,
        num_sanity_val_steps=0,
        logger=logger if logger is not None else False,
        callbacks=_callbacks(cfg, env_cfg, run_dir),
        enable_progress_bar=bool(cfg.progress_bar),
        default_root_dir=str(run_dir),
        **_container(cfg.trainer),
    )
    return Run(cfg, run_dir, module, datamodule, trainer, logger, ckpt)


def _record_config(run: Run) -> None:
    run.run_dir.mkdir(parents=True, exist_ok=True)
    cfg_file = run.run_dir / "config.yaml"
    cfg_file.write_text(OmegaConf.to_yaml(run.cfg))
    if run.logger is None:
        return
    flat = _flatten(_container(run.cfg))
    run.logger.log_hyperparams(flat)
    run.logger.experiment.log_artifact(run.logger.run_id, str(cfg_file))
    (run.run_dir / "mlflow_run_id").write_text(run.logger.run_id)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


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


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Loads a checkpoint written by ``fit`` (on the CPU)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if CONFIG_KEY not in ckpt:
        raise ValueError(f"{path} was not written by rl_lightning fit (it has no stored config).")
    return ckpt


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """Reloads ``cfg.ckpt`` and evaluates its deterministic policy for ``cfg.episodes`` episodes."""
    if cfg.ckpt is None:
        raise ValueError("evaluate needs ckpt=PATH (a checkpoint written by fit).")
    apply_process_settings(cfg)
    ckpt = load_checkpoint(cfg.ckpt)
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    env_cfg = env_config(saved)
    module = build_module(saved, env_cfg)
    module.load_state_dict(ckpt["state_dict"])
    module.to(resolve_device(cfg.device))
    seed = int(cfg.seed) + 20_000
    stats = evaluate_variants(module, env_cfg, int(cfg.episodes), seed, _container(saved.eval.variants))
    print(f"{cfg.episodes} episodes: return {stats['return_mean']:.2f} ± {stats['return_std']:.2f}")
    print(json.dumps({k: round(v, 4) for k, v in stats.items()}))
    if cfg.logger:
        eval_cfg = OmegaConf.merge(cfg, {"logger": {"run_name": f"{saved.name}-evaluate"}})
        logger = _make_logger(eval_cfg, Path(cfg.run_dir))
        logger.log_hyperparams(
            {"ckpt": str(Path(cfg.ckpt).resolve()), "episodes": cfg.episodes, "run": saved.name}
        )
        logger.log_metrics({f"evaluate/{k}": v for k, v in stats.items() if math.isfinite(v)}, step=0)
        logger.finalize("FINISHED")
    return stats
