"""Every private name of a dependency that ``rl_lightning`` uses, each in one place.

A private (``_``-prefixed) name of torch, TensorDict, TorchRL, Lightning, MLflow, ale-py or the standard
library is used only here (``callbacks/`` has its own module, ``callbacks/_compat.py``, since it may not
import ``rl_lightning``; ``tests/test_private_names.py`` fails on one anywhere else). Each entry:

- says which versions it was checked on (:data:`CHECKED`) and why the private name is worth it;
- takes the private path only where the name exists and the installed version lies in that range, and a
  public path otherwise: a release that removes or renames the name costs speed, never correctness;
- has a test that the public path gives the same results (``tests/test_compat.py``).

``docs/compatibility.md`` lists the entries, the versions the suite ran on and what each entry saves.
"""

from __future__ import annotations

import atexit
import functools
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ProgressBar
from packaging.version import Version
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage
from torchrl.data.replay_buffers.samplers import SliceSampler

__all__ = [
    "CHECKED", "HAS_EXIT_STEPS", "HAS_FAST_TD", "HAS_FOREACH", "HAS_MODULE_MOVE_HOOK",
    "HAS_PLAIN_TRAINING_FLAG", "HAS_SLICE_HOOKS", "HAS_STORAGE_BOOKKEEPING", "HAS_TRAINER_SLOT",
    "FragmentedIndexHooks", "MoveHook", "SliceSamplerHooks", "atari_frameskip", "attached_trainer",
    "build_td", "checked", "collector_carrier", "elapsed_steps", "foreach_lerp_", "foreach_mul_",
    "foreach_norm", "mlflow_logger_client", "mlflow_logger_unstarted", "mlflow_schema_tools",
    "run_exit_steps", "sampler_generator", "set_collector_carrier", "set_elapsed_steps",
    "set_mlflow_experiment_id", "set_training_flags", "skip_private_key_filter", "storage_bump_revision",
    "storage_is_full", "storage_last_cursor", "storage_note_write", "storage_revision", "storage_table",
    "storage_written", "td_entries", "wandb_run_started",
]  # fmt: skip

#: The versions each group of entries was checked on, as ``[low, high)``: the fast paths run only there.
#: The suite ran on the versions ``docs/compatibility.md`` lists; the lower ends are the project's
#: supported ones (``pyproject.toml``), whose releases have the same private names.
CHECKED: dict[str, tuple[str, str]] = {
    "torch": ("2.11", "2.15"),
    "tensordict": ("0.14", "0.16"),
    "torchrl": ("0.14", "0.15"),
    "lightning": ("2.6", "2.7"),
    "mlflow": ("3.0", "4.0"),
    "ale-py": ("0.9", "0.13"),
    "gymnasium": ("1.0", "1.5"),
}
#: CPython's ``threading._shutdown`` and ``atexit._run_exitfuncs``: checked on 3.11 to 3.13.
CHECKED_PYTHON = ((3, 11), (3, 14))


@functools.cache
def checked(package: str) -> bool:
    """Whether the installed ``package`` lies in the range its entries were checked on (:data:`CHECKED`);
    ``False`` when it is not installed."""
    low, high = CHECKED[package]
    try:
        installed = Version(metadata.version(package))
    except metadata.PackageNotFoundError:
        return False
    return Version(low) <= Version(installed.base_version) < Version(high)


# ------------------------------------------------------------------------------------------------- torch

#: torch's multi-tensor kernels (``torch._foreach_*``, what its optimizers and ``clip_grad_norm_`` run): one
#: dispatch for a list of tensors instead of one per tensor (a target update of TD-MPC2's 5 Q-nets: one
#: kernel instead of one per parameter). Checked on torch 2.13.0.
HAS_FOREACH = checked("torch") and all(
    callable(getattr(torch, f"_foreach_{op}", None)) for op in ("lerp_", "norm", "mul_")
)


def foreach_lerp_(
    targets: list[torch.Tensor], sources: list[torch.Tensor], weight: float, fast: bool = HAS_FOREACH
) -> None:
    """``t.lerp_(s, weight)`` for each pair, in one multi-tensor kernel where torch has it."""
    if fast:
        torch._foreach_lerp_(targets, sources, weight)
        return
    for t, s in zip(targets, sources):
        t.lerp_(s, weight)


def foreach_norm(tensors: list[torch.Tensor], fast: bool = HAS_FOREACH) -> list[torch.Tensor]:
    """The 2-norm of each tensor."""
    if fast:
        return list(torch._foreach_norm(tensors))
    return [torch.linalg.vector_norm(t) for t in tensors]


def foreach_mul_(tensors: list[torch.Tensor], scalar: torch.Tensor, fast: bool = HAS_FOREACH) -> None:
    """``t.mul_(scalar)`` for each tensor."""
    if fast:
        torch._foreach_mul_(tensors, scalar)
        return
    for t in tensors:
        t.mul_(scalar)


#: ``nn.Module._apply``: the one method every move and cast of a module goes through (``to``, ``cuda``,
#: ``cpu``, ``half``, ``float``, ``to_empty``, ``share_memory``, a parent's move of its children). Checked
#: on torch 2.13.0.
HAS_MODULE_MOVE_HOOK = checked("torch") and callable(getattr(nn.Module, "_apply", None))

#: The public methods that move or cast a module (the fallback of :class:`MoveHook`).
_MOVERS = ("to", "cuda", "cpu", "type", "float", "double", "half", "bfloat16", "to_empty", "share_memory")


class _PrivateMoveHook(nn.Module):
    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.on_move()
        return super()._apply(fn, recurse)

    def on_move(self) -> None:
        """Called before the module (or a parent) moves or casts its tensors."""


def _public_mover(name: str) -> Callable[..., Any]:
    def mover(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.on_move()
        return getattr(super(_PublicMoveHook, self), name)(*args, **kwargs)

    mover.__name__ = name
    return mover


class _PublicMoveHook(nn.Module):
    """:class:`MoveHook` through the public movers: misses a parent's move of this module as a child."""

    def on_move(self) -> None:
        """Called before the module moves or casts its tensors."""


for _name in _MOVERS:
    setattr(_PublicMoveHook, _name, _public_mover(_name))
del _name

#: A module mix-in whose ``on_move`` runs before the module's tensors move or are cast: a module that keeps
#: lists of its tensors (``RLModule``'s parameter lists, walked once instead of per update) drops them
#: there. Through ``nn.Module._apply`` where torch has it, which also sees a parent's move; else through
#: the public movers.
MoveHook: type[nn.Module] = _PrivateMoveHook if HAS_MODULE_MOVE_HOOK else _PublicMoveHook

#: Whether ``nn.Module`` keeps ``training`` as a plain instance attribute (torch 2.x; checked on 2.13.0):
#: then writing it into the instance's ``__dict__`` is what ``nn.Module.__setattr__`` would do, less its
#: checks for parameters, buffers and submodules of that name.
HAS_PLAIN_TRAINING_FLAG = checked("torch") and "training" in vars(nn.Module())


def set_training_flags(modules: Sequence[nn.Module], modes: Sequence[bool], fast: bool = True) -> None:
    """Sets ``m.training = mode`` for each pair, without recursing (``train`` would), directly in the
    instances' ``__dict__`` where torch keeps it there: TD-MPC2's planner switches its world model to eval
    and back on every action, and the plain writes take about a sixth of two ``train`` calls' time."""
    if fast and HAS_PLAIN_TRAINING_FLAG:
        for m, mode in zip(modules, modes, strict=True):
            m.__dict__["training"] = mode
        return
    for m, mode in zip(modules, modes, strict=True):
        m.training = mode


# -------------------------------------------------------------------------------------------- TensorDict

#: ``TensorDict._new_unsafe`` (build without checking every entry) and ``TensorDict._tensordict`` (the
#: entries as a dict): TensorDict's own constructor and ``items()`` check and dispatch per entry, several
#: times the cost of the copies for the one-frame batches of RL (``benchmarks/results/replay_storage.json``).
#: Checked on TensorDict 0.14.3 and 0.15.3.
HAS_FAST_TD = (
    checked("tensordict")
    and callable(getattr(TensorDict, "_new_unsafe", None))
    and isinstance(getattr(TensorDict({}, []), "_tensordict", None), dict)
)


def build_td(
    entries: dict[str, Any], batch_size: torch.Size, device: torch.device | None, fast: bool = HAS_FAST_TD
) -> TensorDict:
    """A ``TensorDict`` of ``entries`` (tensors, or ``TensorDict`` s) that already have the batch size and
    device: built without checking them where TensorDict allows it, else with the public constructor."""
    if fast:
        return TensorDict._new_unsafe(entries, batch_size=batch_size, device=device)
    return TensorDict(entries, batch_size=batch_size, device=device)


def td_entries(td: TensorDict, fast: bool = HAS_FAST_TD) -> Mapping[str, Any]:
    """The top-level entries of a plain ``TensorDict`` (nested ones as ``TensorDict`` s), without a copy
    where TensorDict allows it."""
    if fast:
        return td._tensordict
    return dict(td.items())


# ----------------------------------------------------------------------------------------------- TorchRL


def skip_private_key_filter(collector: Any) -> bool:
    """Turns off a TorchRL collector's removal of private (``"_"``-prefixed) keys from every batch, a walk
    over all its keys (about a tenth of a one-frame collection), for a caller that stores named keys only.
    Where the collector has no such switch (``_exclude_private_keys``, checked on TorchRL 0.14.1) or TorchRL
    lies outside :data:`CHECKED`, it keeps filtering: slower, the same rows. Returns whether the switch was
    there."""
    if not checked("torchrl") or not isinstance(getattr(collector, "_exclude_private_keys", None), bool):
        return False
    collector._exclude_private_keys = False
    return True


#: Where a TorchRL ``Collector`` keeps the tensordict it carries from one step to the next (the envs'
#: current observations and counters, what the policy wrote, the trajectory ids): ``_carrier`` on TorchRL
#: 0.14.1, ``_shuttle`` on the releases before. A resumed run puts the saved one back, so that its first
#: step continues the interrupted one's; without it the resume starts fresh episodes (resumes, not exactly).
_CARRIER_NAMES = ("_carrier", "_shuttle")


def collector_carrier(collector: Any) -> TensorDict | None:
    """The collector's carried tensordict (see :data:`_CARRIER_NAMES`), ``None`` where it has none or
    TorchRL lies outside :data:`CHECKED`."""
    if not checked("torchrl"):
        return None
    for name in _CARRIER_NAMES:
        carrier = getattr(collector, name, None)
        if carrier is not None:
            return carrier
    return None


def set_collector_carrier(collector: Any, carrier: TensorDict) -> bool:
    """Replaces the collector's carried tensordict with ``carrier``; ``False`` (nothing changed) where
    :func:`collector_carrier` finds none."""
    if not checked("torchrl"):
        return False
    for name in _CARRIER_NAMES:
        if getattr(collector, name, None) is not None:
            setattr(collector, name, carrier)
            return True
    return False


def sampler_generator(sampler: Any) -> torch.Generator | None:
    """The random generator a TorchRL sampler was given (``ReplayBuffer(generator=...)`` sets the
    sampler's private ``_rng``; checked on TorchRL 0.14.1), so a sampler of ours draws from the same stream
    as TorchRL's; ``None`` (torch's global generator) where the sampler has none or keeps it elsewhere."""
    rng = getattr(sampler, "_rng", None)
    return rng if isinstance(rng, torch.Generator) else None


#: ``LazyTensorStorage``'s bookkeeping that the replay's direct writes and reads (``data/storage.py``) and
#: the slice samplers' kept trajectory ends (``data/slices.py``) read and update: the stored TensorDict, how
#: full it is, the last cursor and the mutation revision. Checked on TorchRL 0.14.1. Without it, both
#: leave the work to TorchRL's own paths: the same rows and samples, the speed-ups lost.
HAS_STORAGE_BOOKKEEPING = checked("torchrl") and all(
    hasattr(LazyTensorStorage, name)
    for name in (
        "_is_full", "_len_along_dim0", "_set_last_cursor", "_get_new_len", "_bump_mutation_revision",
        "_mutation_revision", "_last_cursor_index",
    )
)  # fmt: skip


def storage_table(storage: Any) -> Any:
    """The storage's ``TensorDict`` of all slots (``None`` before its first write or where it keeps none)."""
    return getattr(storage, "_storage", None)


def storage_is_full(storage: Any) -> bool:
    """Whether every slot has been written (the writer wraps around)."""
    return bool(storage._is_full)


def storage_written(storage: Any) -> int:
    """The number of written slots along the first dimension (the capacity once full)."""
    return int(storage._len_along_dim0)


def storage_revision(storage: Any) -> int:
    """The storage's mutation revision: it grows with every write, ``empty()`` and ``loads``."""
    return int(storage._mutation_revision)


def storage_last_cursor(storage: Any) -> Any:
    """The slot written last (``None`` before a write)."""
    return storage._last_cursor_index


def storage_note_write(storage: Any, cursor: torch.Tensor, data: Any) -> None:
    """Records a write of ``data`` at ``cursor`` as ``LazyTensorStorage.set`` does before it copies: the
    last cursor and the new length."""
    storage._set_last_cursor(cursor)
    storage._get_new_len(data, cursor)


def storage_bump_revision(storage: Any) -> None:
    """Counts a write in the storage's mutation revision, as ``LazyTensorStorage.set`` does after it."""
    storage._bump_mutation_revision()


try:  # TorchRL's fragmented trajectory index, which the replay's interleaved slice sampler keeps sorted
    from torchrl.data.replay_buffers.samplers._trajectory import _FragmentedTrajectoryIndex
except ImportError:  # pragma: no cover - a release without it: the replay samples with SliceSampler
    _FragmentedTrajectoryIndex = None

#: What the replay's slice samplers (``data/slices.py``) build on: ``SliceSampler``'s private steps
#: (``_end_stream``, ``_get_stop_and_length``, ``_finalize_index``) and attributes, its fragmented index
#: (``_FragmentedTrajectoryIndex``) and the storage's bookkeeping. Checked on TorchRL 0.14.1. Without it
#: the replay samples with TorchRL's ``SliceSampler`` itself: the same slices, drawn more slowly
#: (``benchmarks/results/slice_sampler.json``: 9.8 against 1.9 ms per write and sample at 100k frames).
HAS_SLICE_HOOKS = (
    HAS_STORAGE_BOOKKEEPING
    and _FragmentedTrajectoryIndex is not None
    and all(
        callable(getattr(SliceSampler, name, None))
        for name in ("_end_stream", "_get_stop_and_length", "_finalize_index")
    )
    and all(
        callable(getattr(_FragmentedTrajectoryIndex, name, None))
        for name in ("_full_rebuild", "_apply_pending", "runs", "clear")
    )
)


class SliceSamplerHooks(SliceSampler):
    """TorchRL's ``SliceSampler`` with its private steps as named hooks (used only under
    :data:`HAS_SLICE_HOOKS`).

    - :meth:`on_stream_end`: after ``_end_stream`` patched the stream's last steps without a write notice;
    - :meth:`trajectory_bounds`: ``(start [K, 1], stop [K, 1], lengths [K])`` of the stored trajectories
      in place of ``_get_stop_and_length``'s scan, or ``None`` for TorchRL's;
    - :meth:`before_finalize`: the storage (or a view of it) and index that ``_finalize_index`` reads,
      and its keyword arguments, changed in place.
    """

    def _end_stream(self, index: torch.Tensor, *, storage: Any) -> None:
        super()._end_stream(index, storage=storage)
        self.on_stream_end()

    def _get_stop_and_length(self, storage: Any, fallback: bool = True) -> Any:
        found = self.trajectory_bounds(storage)
        return found if found is not None else super()._get_stop_and_length(storage, fallback)

    def _finalize_index(self, *, storage: Any, index: torch.Tensor, **kwargs: Any) -> Any:
        storage, index = self.before_finalize(storage, index, kwargs)
        return super()._finalize_index(storage=storage, index=index, **kwargs)

    def on_stream_end(self) -> None:
        """Called after the sampler patched the stream's last steps."""

    def trajectory_bounds(self, storage: Any) -> Any:
        """The stored trajectories' bounds, or ``None`` to let TorchRL find them."""
        return None

    def before_finalize(self, storage: Any, index: torch.Tensor, kwargs: dict[str, Any]) -> tuple[Any, Any]:
        """What the sample's last step reads: ``(storage, index)``."""
        return storage, index

    @property
    def reads_stored_trajectory_ids(self) -> bool:
        """Whether this sampler (not fragmented, not caching) reads its trajectories from ids stored under a
        key it was given (``traj_key``, not found by guessing), rather than from end flags."""
        return (
            not self.fragmented
            and not self.cache_values
            and bool(self._fetch_traj)
            and not getattr(self, "_traj_key_auto", False)
        )

    @property
    def used_trajectory_key(self) -> Any:
        """The key the trajectory ids are read under."""
        return self._used_traj_key

    def set_fragmented_index(self, index: Any) -> None:
        """Replaces the index of the fragmented mode (``fragmented=True``) with ``index``."""
        self._fragmented_index = index


class FragmentedIndexHooks(_FragmentedTrajectoryIndex or object):  # type: ignore[misc]
    """TorchRL's fragmented trajectory index (used only under :data:`HAS_SLICE_HOOKS`) with its slot
    arrays readable and its rebuild steps as named hooks.

    - :meth:`after_rebuild`: after the index was rebuilt from the whole storage;
    - :meth:`before_pending` / :meth:`after_pending`: around the application of the writes it was told of
      (``before_pending``'s result is handed to ``after_pending``).
    """

    def _full_rebuild(self, storage: Any, revision: int) -> None:
        super()._full_rebuild(storage, revision)
        self.after_rebuild()

    def _apply_pending(self, storage: Any, revision: int) -> None:
        state = self.before_pending(storage)
        super()._apply_pending(storage, revision)
        self.after_pending(state)

    def after_rebuild(self) -> None:
        """Called after a rebuild from the whole storage."""

    def before_pending(self, storage: Any) -> Any:
        """Called before the pending writes are applied; its result goes to :meth:`after_pending`."""
        return None

    def after_pending(self, state: Any) -> None:
        """Called after the pending writes were applied."""

    @property
    def slot_trajectories(self) -> torch.Tensor:
        """``[N]`` the trajectory id of each storage slot the index knows."""
        return self._slot_traj

    @property
    def slot_steps(self) -> torch.Tensor:
        """``[N]`` the step of each slot; negative for a slot without a live record."""
        return self._slot_step

    @property
    def pending_writes(self) -> list[torch.Tensor]:
        """The slot indices of the writes not applied yet."""
        return self._pending_indices

    @property
    def built(self) -> bool:
        """Whether the index holds the trajectories (``False`` once it cleared itself)."""
        return self._trajectory_positions is not None

    @property
    def cached_runs(self) -> Any:
        """What ``runs()`` returns until the next write, ``None`` until it is computed."""
        return self._runs

    @cached_runs.setter
    def cached_runs(self, value: Any) -> None:
        self._runs = value


# --------------------------------------------------------------------------------------------- Lightning

#: ``LightningModule._trainer`` and ``Callback``/``ProgressBar._trainer``: the trainer or ``None``, one
#: attribute read. The public ``trainer`` property raises when there is none (a module outside a Trainer),
#: and a raise and catch per update costs microseconds on the hot path. Checked on Lightning 2.6.6.
HAS_TRAINER_SLOT = checked("lightning") and all(
    "_trainer" in vars(obj) and obj._trainer is None for obj in (LightningModule(), ProgressBar())
)


def attached_trainer(obj: Any, fast: bool = HAS_TRAINER_SLOT) -> Any:
    """The Trainer ``obj`` (a ``LightningModule`` or a progress bar) is attached to, ``None`` outside one."""
    if fast:
        return obj._trainer
    try:
        return obj.trainer
    except (RuntimeError, TypeError):  # a module's "not attached to a `Trainer`", a progress bar's "not set"
        return None


def mlflow_logger_unstarted(logger: Any) -> bool:
    """Whether Lightning's ``MLFlowLogger`` has neither started its run nor looked up its experiment yet
    (its ``_initialized``, ``_run_id`` and ``_experiment_id``; checked on Lightning 2.6.6). ``False`` where
    it keeps them elsewhere: the logger then finds its experiment as Lightning does."""
    state = [getattr(logger, name, ...) for name in ("_initialized", "_run_id", "_experiment_id")]
    return checked("lightning") and state == [False, None, None]


def set_mlflow_experiment_id(logger: Any, experiment_id: str) -> None:
    """Gives an unstarted ``MLFlowLogger`` the id of its experiment (where :func:`mlflow_logger_unstarted`
    said so), which it then uses instead of looking the experiment up."""
    logger._experiment_id = experiment_id


def mlflow_logger_client(logger: Any, tracking_uri: str | None, fast: bool = True) -> Any:
    """The ``MlflowClient`` Lightning's ``MLFlowLogger`` made for ``tracking_uri`` (its ``_mlflow_client``,
    checked on Lightning 2.6.6), else a new one for the same store."""
    client = getattr(logger, "_mlflow_client", None) if fast and checked("lightning") else None
    if client is None:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri)
    return client


def wandb_run_started(logger: Any, fast: bool = True) -> bool:
    """Whether Lightning's ``WandbLogger`` has started its W&B run (its ``_experiment``, checked on
    Lightning 2.6.6; reading the public ``experiment`` would start one). Elsewhere: whether W&B has a run
    in this process, which is the logger's in a process that fits one run at a time."""
    if fast and checked("lightning") and hasattr(logger, "_experiment"):
        return logger._experiment is not None
    import wandb

    return wandb.run is not None


# ------------------------------------------------------------------------------------- MLflow, ale-py


def mlflow_schema_tools() -> tuple[Callable[[], str], Callable[[Any], None]] | None:
    """MLflow's ``_get_latest_schema_revision`` and ``_initialize_tables`` (checked on MLflow 3.17.2): the
    schema's revision, which names an empty store made once as a template, and the function that makes
    one. Copying the template costs milliseconds where MLflow's own migrations of a new store take
    seconds. ``None`` where they are missing: MLflow then makes each store itself."""
    if not checked("mlflow"):
        return None
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision, _initialize_tables
    except ImportError:
        return None
    return _get_latest_schema_revision, _initialize_tables


def atari_frameskip(env: Any, fast: bool = True) -> Any:
    """The frame skip an ALE env was made with: its ``_frameskip`` (checked on ale-py 0.12.1), else the
    ``frameskip`` of its registration (``env.spec.kwargs``, what ``gym.make`` passed), else ``None``."""
    if fast and checked("ale-py") and hasattr(env, "_frameskip"):
        return env._frameskip
    spec = getattr(env, "spec", None)
    return (getattr(spec, "kwargs", None) or {}).get("frameskip")


# ---------------------------------------------------------------------------------------------- gymnasium


def elapsed_steps(wrapper: Any) -> int | None:
    """The steps a gymnasium ``TimeLimit`` counted in the current episode (its ``_elapsed_steps``, checked
    on gymnasium 1.4.0; ``None`` before the first reset, or where gymnasium lies outside :data:`CHECKED` or
    keeps no such count: the env's state then cannot be saved)."""
    if not checked("gymnasium"):
        return None
    steps = getattr(wrapper, "_elapsed_steps", None)
    return steps if isinstance(steps, int) else None


def set_elapsed_steps(wrapper: Any, steps: int) -> None:
    """Sets what :func:`elapsed_steps` reads."""
    wrapper._elapsed_steps = int(steps)


# ----------------------------------------------------------------------------------------------- Python

#: CPython's own first steps at exit: ``threading._shutdown`` (ends thread pools' idle workers, joins the
#: other non-daemon threads) and ``atexit._run_exitfuncs``. A command runs them and then ``os._exit``,
#: skipping the teardown that frees every module one by one (1-2 s once torch, Lightning and MLflow are
#: imported). Checked on Python 3.11.7. Without them a command exits through ``sys.exit``.
HAS_EXIT_STEPS = (
    CHECKED_PYTHON[0] <= sys.version_info[:2] < CHECKED_PYTHON[1]
    and callable(getattr(threading, "_shutdown", None))
    and callable(getattr(atexit, "_run_exitfuncs", None))
)


def run_exit_steps() -> None:
    """Runs the interpreter's first steps at exit (see :data:`HAS_EXIT_STEPS`, which must hold)."""
    threading._shutdown()
    atexit._run_exitfuncs()
