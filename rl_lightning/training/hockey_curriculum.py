"""A hockey training curriculum (game modes and opponents in stages) with a self-play pool.

Modes, named opponents and the validation of a per-episode mix are the hockey env's own (``Mode``,
``NAMED_OPPONENTS``, ``CategoricalMix`` of :mod:`rl_lightning.envs.hockey`); the curriculum adds ``self``, a
share of the opponents played by frozen snapshots of the agent.
"""

from __future__ import annotations

import copy
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from rl_lightning.data.budget import Mark
from rl_lightning.data.datamodule import TrainingEnvs
from rl_lightning.envs.hockey import NAMED_OPPONENTS, CategoricalMix, Mode
from rl_lightning.training.metrics import log_metrics

__all__ = ["HockeyCurriculum", "Stage", "parse_stage"]

MODES = tuple(m.name for m in Mode)
SELF = "self"
OPPONENTS = (*NAMED_OPPONENTS, SELF)
STAGE_KEYS = ("name", "mode", "opponent", "frames", "win_rate", "against")


def _fail(message: str) -> ValueError:
    return ValueError(f"HockeyCurriculum: {message}")


def _mode_name(value: Any) -> str:
    try:
        return Mode.coerce(value).name
    except (ValueError, TypeError):
        raise ValueError(f"unknown mode {value!r}; use one of {list(MODES)} or a mix of them") from None


def _opponent_name(value: Any) -> str:
    name = str(value).strip().lower()
    if name not in OPPONENTS:
        raise ValueError(f"unknown opponent {value!r}; use one of {list(OPPONENTS)} or a mix of them")
    return name


def _setting(value: Any, coerce: Callable[[Any], str], what: str, where: str) -> str | dict[str, float]:
    """A single name, or a mix ``{name: weight}`` checked as the env checks its mixes."""
    try:
        if not isinstance(value, Mapping):
            return coerce(value)
        mix = CategoricalMix(value, coerce, what)
    except ValueError as err:
        raise _fail(f"{where}: {err}.") from None
    return dict(zip(mix.choices, mix.probabilities))


@dataclass(frozen=True)
class Stage:
    """One stage of the curriculum (see :class:`HockeyCurriculum` for the keys)."""

    name: str
    mode: str | dict[str, float]
    opponent: str | dict[str, float]
    frames: int | None
    win_rate: float | None
    against: str | None

    @property
    def uses_self(self) -> bool:
        """Whether the stage's opponents include snapshots of the agent (a positive ``self`` weight)."""
        if isinstance(self.opponent, str):
            return self.opponent == SELF
        return self.opponent.get(SELF, 0.0) > 0

    @property
    def metric(self) -> str:
        """The evaluation metric that ends the stage: ``eval/<against>/win_rate`` or ``eval/win_rate``."""
        return f"eval/{self.against}/win_rate" if self.against else "eval/win_rate"


def parse_stage(raw: Any, index: int, count: int) -> Stage:
    """Checks one stage of the config and returns it; raises a one-line ``ValueError`` saying what to fix."""
    where = f"stage {index}"
    if not isinstance(raw, Mapping):
        raise _fail(f"{where} is {raw!r}; each stage is a mapping with keys among {list(STAGE_KEYS)}.")
    unknown = sorted(set(map(str, raw)) - set(STAGE_KEYS))
    if unknown:
        raise _fail(f"{where} has unknown keys {unknown}; the keys are {list(STAGE_KEYS)}.")
    name = raw.get("name") or f"stage{index}"
    if not isinstance(name, str):
        raise _fail(f"{where}: name {name!r} must be a string.")
    where = f"stage {index} ({name})"
    frames = raw.get("frames")
    if frames is not None and (isinstance(frames, bool) or not isinstance(frames, int) or frames < 1):
        raise _fail(f"{where}: frames={frames!r} must be an int >= 1 (frames spent in the stage) or null.")
    win_rate = raw.get("win_rate")
    if win_rate is not None and (
        isinstance(win_rate, bool) or not isinstance(win_rate, numbers.Real) or not 0 < win_rate <= 1
    ):
        raise _fail(f"{where}: win_rate={win_rate!r} must be a number in (0, 1] or null.")
    against = raw.get("against")
    if against is not None and (not isinstance(against, str) or not against.strip()):
        raise _fail(f"{where}: against={against!r} must be the name of an eval.variants entry or null.")
    if against is not None and win_rate is None:
        raise _fail(f"{where}: against={against!r} needs a win_rate threshold to compare with.")
    if index < count - 1 and frames is None and win_rate is None:
        raise _fail(
            f"{where} never ends: give it frames and/or win_rate (only the last stage runs to the end)."
        )
    return Stage(
        name=name,
        mode=_setting(raw.get("mode", "NORMAL"), _mode_name, "mode", where),
        opponent=_setting(raw.get("opponent", "weak"), _opponent_name, "opponent", where),
        frames=frames,
        win_rate=None if win_rate is None else float(win_rate),
        against=against.strip() if against else None,
    )


@dataclass
class _Snapshot:
    id: int
    frames: int
    policy: torch.nn.Module

    @property
    def name(self) -> str:
        return f"{SELF}_{self.id}"


class HockeyCurriculum(Callback):
    """Moves hockey training through stages of game modes and opponents, and keeps a self-play pool.

    Each stage says what the training envs play: the game ``mode`` (``NORMAL``, ``TRAIN_SHOOTING``,
    ``TRAIN_DEFENSE`` or a per-episode mix such as ``{NORMAL: 0.5, TRAIN_DEFENSE: 0.5}``) and the
    ``opponent`` (``weak``, ``strong``, ``self`` or a per-episode mix such as
    ``{weak: 0.3, strong: 0.4, self: 0.3}``). The run moves to the next stage after ``frames`` frames in the
    stage, or once an evaluation made during the stage reaches ``win_rate`` against the opponent named
    ``against`` (the metric ``eval/<against>/win_rate``; ``against: null`` uses the mean ``eval/win_rate``),
    whichever comes first. Every stage but the last needs one of the two; the last runs to the end. The
    conditions are checked after each training batch (frames do not count during the random warm-up).

    The change reaches the training envs through one port, the data module's
    :class:`~rl_lightning.data.datamodule.TrainingEnvs` (``connect_training_envs``; ``fit`` connects it,
    a script passes ``dm.training_envs``), whose ``call`` calls the hockey env's ``set_curriculum``: each
    env takes it at its next reset, so no episode is cut short. It works with ``env.vectorization`` sync
    and async; TorchRL's worker processes (``collect.workers > 0``) are out of reach and refused.
    Evaluation keeps its own envs and opponents (``eval.variants``). Frames come from the progress view,
    with which the curriculum registers its marks (the end of a stage's frames, the next snapshot).

    A stage that ends on an evaluation's win rate switches at the batch end of that evaluation: Lightning
    runs the checkpoint callback after every other callback, so a checkpoint written at that batch end
    holds the new stage; ``state_dict`` only reads.

    Self-play: while a stage's opponents include ``self``, a frozen copy of the agent's deterministic
    policy (``snapshot_policy()``: ``export_policy()``, or TD-MPC2's policy prior where it plans; deep-copied
    to the CPU, eval mode, no gradients) joins the pool on entering
    the stage and every ``snapshot_every_frames`` frames; the pool keeps the newest ``pool_size``. The
    ``self`` weight is shared equally by the pool's members, which play as ``self_<k>`` (the env's
    ``opponent_name``). A discrete agent's codes are mapped to the continuous hockey actions by the env.

    Metrics (against frames): ``curriculum/stage`` (the stage's index, at the start and at every switch),
    ``curriculum/pool_size`` (whenever the pool changes).

    State (``state_dict``, so a resumed run continues in its stage with its pool): the stage, the frames at
    which it began, the last snapshot's frames and the pool's weights (rebuilt on resume from a fresh
    ``snapshot_policy()`` loaded with them).

    Args:
        stages: the stages in order, each a mapping with ``name``, ``mode``, ``opponent``, ``frames``,
            ``win_rate`` and ``against`` (all optional but the end condition of a stage that is not last).
        snapshot_every_frames: frames between snapshots while a stage plays ``self`` (>= 1).
        pool_size: snapshots kept (>= 1); the oldest leaves first.
        envs: the port to the training envs (``None``: connected later with :meth:`connect_training_envs`).

    Example:
        >>> curriculum = HockeyCurriculum(
        ...     stages=[
        ...         {"name": "shooting", "mode": "TRAIN_SHOOTING", "opponent": "weak", "frames": 20000},
        ...         {"name": "weak", "opponent": "weak", "win_rate": 0.8, "against": "weak"},
        ...         {"name": "self-play", "opponent": {"weak": 0.3, "strong": 0.4, "self": 0.3}},
        ...     ],
        ...     snapshot_every_frames=20000,
        ...     pool_size=5,
        ...     envs=dm.training_envs,  # dm: the hockey env's RLDataModule
        ... )
        >>> trainer = pl.Trainer(callbacks=[curriculum])
    """

    def __init__(
        self,
        stages: Sequence[Mapping[str, Any]],
        snapshot_every_frames: int = 20000,
        pool_size: int = 5,
        envs: TrainingEnvs | None = None,
    ) -> None:
        if isinstance(stages, str | bytes | Mapping) or not isinstance(stages, Sequence) or not stages:
            raise _fail(f"stages={stages!r} must be a non-empty list of stages (mappings).")
        self.stages = tuple(parse_stage(raw, i, len(stages)) for i, raw in enumerate(stages))
        for name, value in (("snapshot_every_frames", snapshot_every_frames), ("pool_size", pool_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise _fail(f"{name}={value!r} must be an int >= 1.")
        self.snapshot_every_frames = snapshot_every_frames
        self.pool_size = pool_size
        self.stage = 0
        self.stage_start_frames: int | None = None
        self.last_snapshot_frames: int | None = None
        self.pool: list[_Snapshot] = []
        self._next_id = 0
        self._restored_pool: list[dict[str, Any]] | None = None
        self._seen_eval: Any = None
        self.envs = envs
        #: Due when the current stage's frames are spent, and when the next self-play snapshot is.
        self.stage_mark = Mark("frames")
        self.snapshot_mark = Mark("frames")
        self._move_marks()

    @property
    def current(self) -> Stage:
        """The stage the run is in."""
        return self.stages[self.stage]

    def connect_training_envs(self, envs: TrainingEnvs) -> None:
        """Keeps ``envs``, the port through which the stages reach the training envs."""
        self.envs = envs

    # ------------------------------------------------------------------ hooks
    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if self.envs is None:
            raise TypeError(
                "HockeyCurriculum has no way to the training envs: give it the data module's port "
                "(envs=dm.training_envs, or connect_training_envs) or remove the callback."
            )
        if any(s.uses_self for s in self.stages):
            try:
                pl_module.snapshot_policy()
            except (AttributeError, NotImplementedError) as err:
                raise _fail(
                    f"self-play needs the agent's deterministic policy as a module, and "
                    f"{type(pl_module).__name__}.snapshot_policy() is not available ({err}); drop 'self' "
                    "from the opponents or use an algorithm that exports its policy."
                ) from None
        progress = trainer.datamodule.progress
        progress.register_mark(self.stage_mark)
        progress.register_mark(self.snapshot_mark)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        frames = self._frames(trainer, pl_module)
        if self._restored_pool is not None:
            # An empty pool (no self-play yet, or none at all) needs no template: a planning agent has none.
            template = pl_module.snapshot_policy() if self._restored_pool else None
            self.pool = [
                _Snapshot(int(s["id"]), int(s["frames"]), self._frozen(template, s["state"]))
                for s in self._restored_pool
            ]
            self._restored_pool = None
        if self.stage_start_frames is None:
            self.stage_start_frames = frames
        if self.current.uses_self and not self.pool:
            self._snapshot(pl_module, frames)
        self._move_marks()
        self._apply(trainer)
        self._log(trainer, pl_module, pool=bool(self.pool))
        self._seen_eval = trainer.callback_metrics.get(self.current.metric)

    def _move_marks(self) -> None:
        """Sets the marks to the current stage: its frames end at ``stage_start_frames + frames``; a
        self-play stage snapshots every ``snapshot_every_frames``. A stage that ends on a win rate ends at
        an evaluation's batch end, due on its own."""
        stage = self.current
        ends_on_frames = self.stage < len(self.stages) - 1 and stage.frames is not None
        self.stage_mark.last = self.stage_start_frames or 0
        self.stage_mark.every = stage.frames if ends_on_frames else math.inf
        self.snapshot_mark.last = self.last_snapshot_frames or 0
        self.snapshot_mark.every = self.snapshot_every_frames if stage.uses_self else math.inf

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        self._update(trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The last evaluation runs at the epoch's end; the checkpoint written after it holds its outcome.
        self._update(trainer, pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        if self._restored_pool is not None:
            pool = self._restored_pool
        else:
            pool = [
                {
                    "id": s.id,
                    "frames": s.frames,
                    "state": {k: v.detach().cpu().clone() for k, v in s.policy.state_dict().items()},
                }
                for s in self.pool
            ]
        return {
            "stage": self.stage,
            "stage_name": self.current.name,
            "stage_start_frames": self.stage_start_frames,
            "last_snapshot_frames": self.last_snapshot_frames,
            "next_id": self._next_id,
            "pool": pool,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        stage = int(state_dict["stage"])
        if not 0 <= stage < len(self.stages):
            raise _fail(
                f"the checkpoint is in stage {stage} ({state_dict.get('stage_name')}) but this curriculum "
                f"has {len(self.stages)} stages; resume with the stages the run was started with."
            )
        self.stage = stage
        self.stage_start_frames = state_dict["stage_start_frames"]
        self.last_snapshot_frames = state_dict["last_snapshot_frames"]
        self._next_id = int(state_dict["next_id"])
        self._restored_pool = list(state_dict["pool"])  # rebuilt in on_fit_start, with the module
        self._move_marks()

    # ------------------------------------------------------------------ the work
    @staticmethod
    def _frames(trainer: pl.Trainer, pl_module: pl.LightningModule) -> int:
        return trainer.datamodule.progress.frames

    def _update(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        frames = self._frames(trainer, pl_module)
        reason = self._due(trainer, frames)
        pool_changed = False
        if reason is not None:
            self.stage += 1
            self.stage_start_frames = frames
            self._seen_eval = trainer.callback_metrics.get(self.current.metric)
            rank_zero_info(
                f"curriculum: stage {self.stage} ({self.current.name}) at {frames} frames, after {reason}"
            )
            if self.current.uses_self:  # the newest agent joins the pool on entering a self-play stage
                self._snapshot(pl_module, frames)
                pool_changed = True
        elif (
            self.current.uses_self and frames - (self.last_snapshot_frames or 0) >= self.snapshot_every_frames
        ):
            self._snapshot(pl_module, frames)
            pool_changed = True
        if reason is not None or pool_changed:
            self._move_marks()
            self._apply(trainer)
            self._log(trainer, pl_module, pool=pool_changed)

    def _due(self, trainer: pl.Trainer, frames: int) -> str | None:
        """Why the current stage ends now (``None``: it goes on)."""
        if self.stage == len(self.stages) - 1:
            return None
        stage = self.current
        if stage.frames is not None and frames - (self.stage_start_frames or 0) >= stage.frames:
            return f"{stage.frames} frames in {stage.name}"
        if stage.win_rate is None:
            return None
        metrics = trainer.callback_metrics
        value = metrics.get(stage.metric)
        if value is None:
            evaluated = sorted(k for k in metrics if k.startswith("eval/") and k.endswith("win_rate"))
            if any(k.startswith("eval/") for k in metrics):
                raise _fail(
                    f"stage {self.stage} ({stage.name}) waits for {stage.metric}, which the evaluation does "
                    f"not log (it logs {evaluated or 'no win rate'}); set against to an eval.variants name "
                    "or null, and keep winner in env.info_keys."
                )
            return None
        if value is self._seen_eval:  # the evaluation writes a new tensor each time
            return None
        self._seen_eval = value
        if float(value) >= stage.win_rate:
            return f"{stage.metric}={float(value):.2f} >= {stage.win_rate}"
        return None

    @staticmethod
    def _frozen(
        template: torch.nn.Module, state: Mapping[str, torch.Tensor] | None = None
    ) -> torch.nn.Module:
        policy = copy.deepcopy(template).to("cpu")
        if state is not None:
            policy.load_state_dict(state)
        return policy.eval().requires_grad_(False)

    def _snapshot(self, pl_module: pl.LightningModule, frames: int) -> None:
        self.pool.append(_Snapshot(self._next_id, frames, self._frozen(pl_module.snapshot_policy())))
        self._next_id += 1
        del self.pool[: -self.pool_size]
        self.last_snapshot_frames = frames

    def opponent_mix(self) -> str | dict[str, float]:
        """The current stage's opponents, with ``self`` split equally among the pool's members."""
        opponent = self.current.opponent
        if not self.current.uses_self:
            return opponent
        weights = {SELF: 1.0} if isinstance(opponent, str) else dict(opponent)
        share = weights.pop(SELF) / max(1, len(self.pool))
        weights.update({s.name: share for s in self.pool})
        return weights

    def _apply(self, trainer: pl.Trainer) -> None:
        stage = self.current
        policies = {s.name: s.policy for s in self.pool} if stage.uses_self else {}
        try:
            self.envs.call("set_curriculum", mode=stage.mode, opponent=self.opponent_mix(), policies=policies)
        except AttributeError:
            raise _fail(
                "the training env has no set_curriculum(); use the single-agent hockey env "
                "(env=hockey or env=hockey_discrete) or remove the callback."
            ) from None

    def _log(self, trainer: pl.Trainer, pl_module: pl.LightningModule, pool: bool) -> None:
        metrics = {"curriculum/stage": float(self.stage)}
        if pool:
            metrics["curriculum/pool_size"] = float(len(self.pool))
        log_metrics(trainer, metrics, self._frames(trainer, pl_module))
