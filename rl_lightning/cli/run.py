"""Building a run from the composed config: module, data module, trainer, logger and callbacks."""

from __future__ import annotations

import itertools
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from rl_lightning.algos.base import RLModule
from rl_lightning.cli.config import CliError
from rl_lightning.cli.process import apply_process_settings
from rl_lightning.cli.validate import check_config
from rl_lightning.data.datamodule import RANK_SEED_STRIDE, CollectConfig, RLDataModule, UsesTrainingEnvs
from rl_lightning.data.replay import ReplayConfig
from rl_lightning.device import resolve_device
from rl_lightning.envs.agents import policy_specs
from rl_lightning.envs.factory import EnvConfig, check_spaces, env_modules, make_env
from rl_lightning.training.checkpoint import ConfigInCheckpoint, FrameCheckpoint, replay_path
from rl_lightning.training.evaluation import EvalCallback, VideoSettings
from rl_lightning.training.feedback import UpdateFeedback
from rl_lightning.training.interrupt import StopOnInterrupt
from rl_lightning.training.loggers import build_logger
from rl_lightning.training.progress import FramesProgressBar
from rl_lightning.training.protocol import SeedSets, check_disjoint, eval_envs
from rl_lightning.training.safe_load import check_replay_dir, load_checkpoint
from rl_lightning.training.video import check_video_format

#: Environment variable through which rank 0 of a DDP run tells the ranks it launches its run directory.
RUN_DIR_ENV = "RL_LIGHTNING_RUN_DIR"

__all__ = [
    "RUN_DIR_ENV", "Run", "build_module", "build_run", "check_env_imports", "container", "env_config",
    "make_logger", "seed_sets",
    "tracking_uri",
]  # fmt: skip


def container(node: Any) -> Any:
    """A config node as plain Python containers (resolved); other values unchanged."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def env_config(cfg: DictConfig) -> EnvConfig:
    return EnvConfig.from_mapping(container(cfg.env))


def check_env_imports(saved: DictConfig, cfg: DictConfig) -> None:
    """Refuses, in one line, to make the env of a stored run whose modules this command did not name.

    A checkpoint may come from elsewhere: the modules its env needs (``env.packages`` and the module of a
    ``module:Id`` id) run code when imported, so ``evaluate`` and ``export`` import one only when the user
    names it on their command line (``env.packages=[module]``) or it is imported already.
    """
    named = set(cfg.env.get("packages") or ())
    missing = [m for m in env_modules(env_config(saved)) if m not in named and m not in sys.modules]
    if missing:
        listed = ",".join(missing)
        raise CliError(
            f"this checkpoint's env ({saved.env.id}) needs module(s) {listed}, and a checkpoint never "
            f"imports code by itself: name them to import them, env.packages=[{listed}]."
        )


def seed_sets(run: DictConfig, test_seed: int, test_episodes: int, ranks: int | None = None) -> SeedSets:
    """The seeds of ``run``'s training envs and validation episodes, and of ``test_episodes`` test episodes
    from ``test_seed`` (:mod:`rl_lightning.training.protocol`). ``ranks``: the run's processes (default:
    its ``trainer.devices`` times ``trainer.num_nodes`` where those are numbers)."""
    env = env_config(run)
    if ranks is None:  # a stored config of an older version may lack a key: the defaults then
        devices, nodes = (
            OmegaConf.select(run, "trainer.devices", default=1),
            OmegaConf.select(run, "trainer.num_nodes", default=1),
        )
        ranks = devices * nodes if isinstance(devices, int) and isinstance(nodes, int) else 1
    return SeedSets.of_run(
        seed=int(run.seed),
        total_frames=int(run.total_frames),
        train_envs=env.num_envs * max(1, int(OmegaConf.select(run, "collect.workers", default=0))),
        ranks=max(1, ranks),
        rank_stride=RANK_SEED_STRIDE,
        validation_seed=int(run.eval.seed),
        test_seed=test_seed,
        eval_envs=eval_envs(env.eval_num_envs, max(int(run.eval.episodes), test_episodes)),
    )


def build_module(cfg: DictConfig, env_cfg: EnvConfig) -> RLModule:
    """Instantiates ``cfg.algo`` with the specs of the env (derived, never typed into the config)."""
    probe = make_env(env_cfg, num_envs=1)
    try:
        # Specs are objects, not config: bind them after instantiation so OmegaConf never sees them.
        factory = instantiate(cfg.algo, _partial_=True, _convert_="all")
        observation_spec, action_spec = policy_specs(probe)  # one row: an env, or an agent of a group
        module = factory(observation_spec=observation_spec, action_spec=action_spec)
    finally:
        probe.close()
    return module


def restore_module(ckpt: dict[str, Any], cfg: DictConfig, env_cfg: EnvConfig | None = None) -> RLModule:
    """The module of a checkpoint read with :func:`load_checkpoint`, in eval mode.

    Args:
        ckpt: the checkpoint.
        cfg: the run's config from the checkpoint, possibly edited (``evaluate plan=...`` sets
            ``algo.mpc``).
        env_cfg: the env the specs come from; ``None``: :func:`env_config` of ``cfg``.
    """
    module = build_module(cfg, env_config(cfg) if env_cfg is None else env_cfg)
    module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"])
    return module.eval()


@dataclass
class Run:
    """Everything ``fit`` needs, built from one config."""

    cfg: DictConfig
    run_dir: Path
    device: torch.device
    module: RLModule
    datamodule: RLDataModule
    trainer: L.Trainer
    logger: Logger | None
    ckpt_path: str | None
    checkpoint: FrameCheckpoint
    stop: StopOnInterrupt
    #: ``run_dir`` was made by this build (``claim_run_dir``): a new run's, which a failed start removes.
    created: bool = False


def _run_of(run_dir: Path) -> dict[str, Any] | None:
    """``name``, ``algo._target_`` and ``env.id`` of the run in ``run_dir`` (from its config.yaml)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    try:
        saved = OmegaConf.load(path)
        return {"name": saved.name, "algo": saved.algo._target_, "env": saved.env.id}
    except Exception:
        return None


def _identity(cfg: DictConfig) -> dict[str, Any]:
    return {"name": cfg.name, "algo": cfg.algo._target_, "env": cfg.env.id}


def _find_last(cfg: DictConfig, runs_root: Path) -> Path:
    """The newest ``last.ckpt`` of a run of the same experiment: same name, algorithm and env.

    Debug runs (``+debug=quick``) live under ``runs/debug/``, apart from the real runs of that name.
    """
    found = sorted(runs_root.glob(f"{cfg.name}/*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    same = [p for p in found if _run_of(p.parent.parent) == _identity(cfg)]
    if not same:
        raise FileNotFoundError(
            f"ckpt_path=last: no checkpoint of a run of '{cfg.name}' ({cfg.algo._target_.rsplit('.', 1)[-1]} "
            f"on {cfg.env.id}) under {runs_root / cfg.name}; start a run first or pass ckpt_path=PATH."
        )
    return same[-1]


def _picks_its_run_dir() -> bool:
    """Whether a new run of this process chooses its directory. The ranks Lightning launches take rank 0's
    (``RUN_DIR_ENV``), and ranks started together by an outside launcher (``torchrun`` sets ``WORLD_SIZE``)
    keep the given ``run_dir``: they must agree on it, and another rank may have made it already."""
    from lightning.pytorch.utilities import rank_zero_only

    return rank_zero_only.rank == 0 and os.environ.get("WORLD_SIZE", "1") == "1"


def _resolve_resume(cfg: DictConfig) -> tuple[Path, str | None]:
    """The run directory and the checkpoint to resume from (``None`` for a new run).

    A new run never takes the directory of another: when ``run_dir`` exists (a run of the same name started
    in the same second, the resolution of ``${now:...}``), it gets the first free ``run_dir-1``, ``-2``, ...
    Otherwise the new run would read the other's ``mlflow_run_id`` and log into its MLflow run.
    """
    run_dir = Path(cfg.run_dir)
    if cfg.ckpt_path is None:
        if not _picks_its_run_dir():
            return run_dir, None
        candidates = (run_dir.with_name(f"{run_dir.name}-{n}") if n else run_dir for n in itertools.count())
        return next(d for d in candidates if not d.exists()), None
    if cfg.ckpt_path == "last":
        ckpt = _find_last(cfg, run_dir.parent.parent)
    else:
        ckpt = Path(cfg.ckpt_path)
        if not ckpt.is_file():
            raise FileNotFoundError(f"checkpoint not found: {ckpt}")
    # A checkpoint of ours lives in <run_dir>/checkpoints/: the resumed run continues in that directory.
    if ckpt.parent.name == "checkpoints":
        run_dir = ckpt.parent.parent
        saved = _run_of(run_dir)
        if saved is not None and (saved["algo"], saved["env"]) != (cfg.algo._target_, cfg.env.id):
            theirs, ours = saved["algo"].rsplit(".", 1)[-1], cfg.algo._target_.rsplit(".", 1)[-1]
            raise CliError(
                f"ckpt_path={ckpt} is a run of {theirs} on {saved['env']}, but this command trains {ours} "
                f"on {cfg.env.id}; resume it with the experiment it was started with."
            )
    return run_dir, str(ckpt)


def tracking_uri(uri: str) -> str:
    """``logger.tracking_uri`` with a relative ``sqlite:///`` path made absolute (from the working
    directory), so the run and ``mlflow ui`` started elsewhere find the same store."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri[len("sqlite:///") :]).resolve())
    return uri


def make_logger(cfg: DictConfig, run_dir: Path) -> Logger | None:
    """The logger of ``cfg.logger`` (``None``: ``logger=none``; see :mod:`rl_lightning.training.loggers`);
    an MLflow run or a W&B run named in ``run_dir`` is continued."""
    if not cfg.logger:
        return None
    lcfg = container(cfg.logger)
    uri = tracking_uri(lcfg["tracking_uri"]) if "tracking_uri" in lcfg else None
    return build_logger(lcfg, run_dir, uri)


def _callbacks(
    cfg: DictConfig, env_cfg: EnvConfig, checkpoint: FrameCheckpoint, stop: StopOnInterrupt, run_dir: Path
) -> list[L.Callback]:
    video = None
    if cfg.eval.video.every_frames:
        check_video_format(cfg.eval.video.format)  # a missing package fails now, not at the first video
        video = VideoSettings(dir=run_dir / "videos", **container(cfg.eval.video))
    callbacks: list[L.Callback] = [
        stop,
        UpdateFeedback(log_every_n_updates=int(cfg.log_every_n_updates)),
        EvalCallback(
            env_cfg,
            every_frames=cfg.eval.every_frames,
            episodes=cfg.eval.episodes,
            seed=cfg.eval.seed,
            variants=container(cfg.eval.variants),
            should_stop=lambda: stop.requested,
            video=video,
        ),
        checkpoint,
        ConfigInCheckpoint(container(cfg)),
    ]
    if cfg.progress_bar:
        callbacks.append(FramesProgressBar(plain_every_s=float(cfg.progress_every_s)))
    for name, node in (cfg.callbacks or {}).items():
        if node is None:
            continue
        if "_target_" not in node:
            raise ValueError(
                f"callbacks.{name} has no _target_; set it or disable it with callbacks.{name}=null."
            )
        try:
            callbacks.append(instantiate(node, _convert_="all"))
        except InstantiationException as err:
            # A callback's argument check says what to fix in one line: show it, not Hydra's wrapper.
            if isinstance(err.__cause__, ValueError):
                raise err.__cause__ from None
            raise
    return callbacks


def _strategy(name: Any, module: RLModule) -> Any:
    """``trainer.strategy``: ``ddp`` becomes Lightning's DDP strategy set for this algorithm, others pass.

    ``find_unused_parameters`` only where the algorithm needs it (several backward passes per update that
    each leave some parameters without a gradient: TD-MPC2's two losses, TD3's critic-only steps), and no
    buffer broadcast: buffers (frame counters, target networks moved by identical Polyak steps) are the
    same on every rank already, and broadcasting them every update costs a collective.
    """
    if name != "ddp":
        return name
    import inspect

    from lightning.pytorch.strategies import DDPStrategy
    from torch.nn.parallel import DistributedDataParallel

    # torch 2.13 renamed the option (the GPU image's 2.11 has only the old name).
    newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    no_sync = {"forward_sync_buffers": False} if newer else {"broadcast_buffers": False}
    return DDPStrategy(find_unused_parameters=module.ddp_find_unused_parameters, **no_sync)


def _shared_run_dir(run_dir: Path) -> Path:
    """The run directory of the whole DDP run: rank 0 names it, the ranks it launches read it back."""
    from lightning.pytorch.utilities import rank_zero_only

    shared = os.environ.get(RUN_DIR_ENV)
    return Path(shared) if shared and rank_zero_only.rank != 0 else run_dir


def _claim(run_dir: Path) -> tuple[Path, list[Path]]:
    """Makes the first free one of ``run_dir``, ``run_dir-1``, ... atomically (a run started at the same
    time may take a name between a look and a ``mkdir``); returns it with the parents made for it."""
    made = [p for p in run_dir.parents if not p.exists()]
    for n in itertools.count():
        candidate = run_dir.with_name(f"{run_dir.name}-{n}") if n else run_dir
        try:
            candidate.mkdir(parents=True)
            return candidate, made
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def _unclaim(run_dir: Path, made: list[Path]) -> None:
    """Removes a directory :func:`_claim` made, and the parents made for it while they are empty (a run
    started beside it may have filled them since)."""
    shutil.rmtree(run_dir, ignore_errors=True)
    for parent in made:  # innermost first
        try:
            parent.rmdir()  # only an empty one
        except OSError:
            break


def build_run(cfg: DictConfig, claim_run_dir: bool = False) -> Run:
    """Builds module, data module, trainer and logger from the composed config.

    The run directory is chosen first, and the device resolved once, before anything is built. With
    ``claim_run_dir`` (``fit``) a new run makes its directory then, atomically, so two runs started at once
    never share one. Everything the config can get wrong (unknown env, an algorithm that does not fit the
    env, a replay config that contradicts the algorithm) fails here, before anything is written: a directory
    this build made is removed again.
    """
    check_config(cfg)
    apply_process_settings(cfg)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    run_dir, ckpt = _resolve_resume(cfg)
    created = claim_run_dir and ckpt is None and _picks_its_run_dir()
    if created:
        run_dir, made = _claim(run_dir)
    if ckpt is None and str(run_dir) != cfg.run_dir:
        cfg.run_dir = str(run_dir)  # the recorded config names the directory the new run took
    run_dir = _shared_run_dir(run_dir)
    try:
        return _build(cfg, run_dir, ckpt, created)
    except BaseException:
        if created:
            _unclaim(run_dir, made)
        raise


def _build(cfg: DictConfig, run_dir: Path, ckpt: str | None, created: bool) -> Run:
    try:  # a run never chooses its checkpoint on the episodes its figures are reported on
        check_disjoint(seed_sets(cfg, int(cfg.eval.test_seed), int(cfg.eval.test_episodes)))
    except ValueError as err:
        raise CliError(str(err)) from None
    env_cfg = env_config(cfg)
    if env_modules(env_cfg):  # the user's own env: its spaces checked once, before anything is built
        check_spaces(env_cfg)
    device = resolve_device(cfg.device)
    module = build_module(cfg, env_cfg)
    stop = StopOnInterrupt()
    if ckpt is not None:
        # Both are checked before Lightning restores them: a shared file must not run code.
        load_checkpoint(ckpt, check_config=False)  # the run's config is this command's, not the stored one
        check_replay_dir(replay_path(ckpt))
    datamodule = RLDataModule(
        env_cfg,
        ReplayConfig(**container(cfg.replay)),
        CollectConfig(total_frames=cfg.total_frames, **container(cfg.collect)),
        module,
        device=device,
        seed=cfg.seed,
        stop_request=lambda: stop.requested,
        resume_replay_from=replay_path(ckpt) if ckpt is not None else None,
    )
    checkpoint = FrameCheckpoint(
        dirpath=run_dir / "checkpoints",
        every_frames=cfg.checkpoint.every_frames,
        monitor=cfg.checkpoint.monitor,
        mode=cfg.checkpoint.mode,
        save_replay=datamodule.save_replay,
    )
    logger = make_logger(cfg, run_dir)
    trainer_kwargs = container(cfg.trainer)
    trainer_kwargs["strategy"] = _strategy(trainer_kwargs.get("strategy", "auto"), module)
    callbacks = _callbacks(cfg, env_cfg, checkpoint, stop, run_dir)
    for callback in callbacks:  # the one way to the training envs (hockey's curriculum)
        if isinstance(callback, UsesTrainingEnvs):
            callback.connect_training_envs(datamodule.training_envs)
    trainer = L.Trainer(
        accelerator=device.type,
        max_epochs=-1,
        num_sanity_val_steps=0,
        logger=logger if logger is not None else False,
        callbacks=callbacks,
        enable_progress_bar=bool(cfg.progress_bar),
        default_root_dir=str(run_dir),
        **trainer_kwargs,
    )
    if datamodule.collect.backend == "ray" and trainer.world_size > 1:
        # Every rank would start (or join) Ray and open its own weight-sync group beside DDP's.
        raise CliError(
            f"collect.backend=ray collects for one training process, not {trainer.world_size} ranks: "
            "drop trainer=ddp, or use collect.backend=local (its workers run per rank)."
        )
    return Run(cfg, run_dir, device, module, datamodule, trainer, logger, ckpt, checkpoint, stop, created)
