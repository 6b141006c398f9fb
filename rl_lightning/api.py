"""rl_lightning from Python: compose a run, build its Lightning parts, train, load a checkpoint and act.

    import rl_lightning as rll

    result = rll.fit("+experiment=dqn_cartpole", "total_frames=20000")   # python -m rl_lightning fit ...
    agent = rll.load(result.best_ckpt)                                   # safe: weights only
    actions = rll.act(agent, observations)                               # [N, *obs] -> [N, *action]

    cfg = rll.config("+experiment=sac_pendulum", "seed=1")   # the CLI's composition, as a DictConfig
    run = rll.build(cfg)   # run.module, run.datamodule, run.trainer (with the project's callbacks)
    run.trainer.fit(run.module, datamodule=run.datamodule)

:func:`fit` is ``python -m rl_lightning fit`` in one call (the same defaults, run folder, checkpoints and
MLflow run, the summary printed); :func:`build` hands over the parts for a loop of one's own. The names
here, listed in ``rl_lightning.__all__``, are the stable ones; every other module is the framework's own.
This module sits on top of the command line's builders (``rl_lightning.cli``), beside the commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from rl_lightning.algos.base import RLModule
from rl_lightning.cli import compose, require_run_choice
from rl_lightning.cli.run import Run, build_run, check_env_imports, restore_module
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

__all__ = ["FitResult", "act", "build", "config", "fit", "load"]


def config(*overrides: str) -> DictConfig:
    """The config of a run, composed from ``conf/`` with Hydra overrides as the command line takes them
    (``"+experiment=dqn_cartpole"``, ``"total_frames=20000"``, ``"algo=sac"``, ``"env.id=Pendulum-v1"``)."""
    return compose(list(overrides))


def build(cfg: DictConfig) -> Run:
    """The parts of a run: ``module`` (the algorithm's ``LightningModule``), ``datamodule`` (TorchRL
    collector and replay), ``trainer`` (a ``lightning.Trainer`` with the project's callbacks), ``logger``
    and ``run_dir``. ``run.trainer.fit(run.module, datamodule=run.datamodule)`` trains it."""
    return build_run(cfg, claim_run_dir=True)


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit` leaves: the run's folder, its checkpoints and the trained module."""

    run_dir: Path
    last_ckpt: Path | None
    best_ckpt: Path | None
    frames: int
    updates: int
    module: RLModule


def fit(*overrides: str) -> FitResult:
    """``python -m rl_lightning fit OVERRIDES`` in this process: trains, checkpoints and logs as the command
    does, and returns where the results are (``KeyboardInterrupt`` when stopped, as the command)."""
    from rl_lightning.cli.fit import fit as fit_command

    require_run_choice(list(overrides))
    run = fit_command(config(*overrides))
    ck = run.checkpoint
    return FitResult(
        run_dir=Path(run.run_dir),
        last_ckpt=ck.last_path if ck.last_path.is_file() else None,
        best_ckpt=ck.best_path if ck.best_path.is_file() else None,
        frames=run.datamodule.frames,
        updates=run.datamodule.updates,
        module=run.module,
    )


def load(ckpt: str | Path, packages: Sequence[str] = (), device: str = "cpu") -> RLModule:
    """The algorithm of a checkpoint, in eval mode on ``device``, loaded safely (weights only, the stored
    config's targets checked). An env of one's own is imported only when its module is named in
    ``packages`` (a shared checkpoint never imports code by itself)."""
    checkpoint = load_checkpoint(str(ckpt))
    saved = OmegaConf.create(checkpoint[CONFIG_KEY]["config"])
    check_env_imports(saved, OmegaConf.create({"env": {"packages": list(packages)}}))
    return restore_module(checkpoint, saved).to(device)


@torch.no_grad()
def act(module: RLModule, observations: Any) -> torch.Tensor:
    """The deterministic policy's actions for a batch of observations ``[N, *obs_shape]`` (a tensor or an
    array), in the env's units: ``[N, *action_shape]``."""
    obs = torch.as_tensor(np.asarray(observations) if not torch.is_tensor(observations) else observations)
    obs = obs.to(module.device)
    td = TensorDict({"observation": obs}, batch_size=[obs.shape[0]], device=module.device)
    return module.act_eval(td)["action"]
