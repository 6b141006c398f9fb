"""Hyperparameters that families of algorithms share, defined once as typed, frozen dataclasses.

A group (:class:`HParams`) lists a family's common settings with their defaults, types and checks in one
place. An algorithm's constructor names only what it adds and takes the group's keys as ``**shared``::

    @shares(SoftActorCriticHParams)
    class SAC(SoftActorCritic):
        def __init__(self, observation_spec, action_spec, target_entropy=None, **shared): ...

Hydra still instantiates it from the flat keys of ``conf/algo/*.yaml``: :func:`shares` publishes the
constructor's arguments and the group's fields, with defaults and types, as the class's signature, which
the CLI's key check (and its suggestions for a misspelled key) and the config tests read;
:func:`save_hparams` records every one of them, flat and with its default, in ``hparams``, so a
checkpoint's hyperparameters rebuild the module (``load_from_checkpoint``) as before.

The groups here are the actor-critic families': :class:`ActorCriticHParams` (what SAC, discrete SAC, SAC
with options, TD3, DDPG and AC-IQN have in common), :class:`SoftActorCriticHParams` (the SAC family's
temperature and critics) and :class:`DeterministicActorCriticHParams` (TD3's and DDPG's exploration).
TD-MPC2's planner and loss settings are groups of their own (``tdmpc2/planner.py``, ``tdmpc2/losses.py``), and
so are the value-based family's (``value_based.py``).
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from lightning.pytorch.core.mixins import HyperparametersMixin
from lightning.pytorch.utilities.parsing import collect_init_args

from rl_lightning.algos.base import IncompatibleEnvError, RLModule

__all__ = [
    "ActorCriticHParams",
    "DeterministicActorCriticHParams",
    "HParams",
    "SoftActorCriticHParams",
    "save_hparams",
    "shares",
    "split_shared",
    "vector_obs_dim",
]

_Cls = TypeVar("_Cls", bound=type)

#: Constructor arguments that come from the env, never recorded as hyperparameters.
SPEC_ARGS = ("observation_spec", "action_spec")


@dataclass(frozen=True, kw_only=True)
class HParams:
    """A group of hyperparameters; a subclass checks its values in ``__post_init__`` (one clear line,
    ``ValueError``, naming the ``algo.`` key)."""

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, values as given (not copied)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))


def _check(ok: bool, key: str, value: Any, rule: str) -> None:
    if not ok:
        raise ValueError(f"algo.{key}={value!r} {rule}.")


@dataclass(frozen=True, kw_only=True)
class ActorCriticHParams(HParams):
    """What every actor-critic here has: an actor and critics with their own Adam, a discount, Polyak
    target networks and optional gradient clipping.

    Attributes:
        actor_lr: Adam learning rate of the actor.
        critic_lr: Adam learning rate of the critics.
        gamma: discount.
        tau: Polyak rate of the target networks (1 copies them every step).
        grad_clip: max gradient norm of the actor and of the critics (``None``: no clipping).
    """

    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    gamma: float = 0.99
    tau: float = 0.005
    grad_clip: float | None = None

    def __post_init__(self) -> None:
        _check(0.0 < self.gamma <= 1.0, "gamma", self.gamma, "must lie in (0, 1]")
        _check(0.0 < self.tau <= 1.0, "tau", self.tau, "must lie in (0, 1] (1 copies the targets every step)")
        _check(
            self.grad_clip is None or self.grad_clip > 0,
            "grad_clip",
            self.grad_clip,
            "must be > 0 or null (no clipping)",
        )


@dataclass(frozen=True, kw_only=True)
class SoftActorCriticHParams(ActorCriticHParams):
    """The SAC family's (SAC, discrete SAC, SAC with options): one MLP width for actor and critics, a
    critic ensemble and a learned entropy temperature.

    Attributes:
        hidden_sizes: hidden widths of the actor and of each critic.
        num_qvalue_nets: critics in the ensemble; the target is the minimum over them.
        alpha_lr: Adam learning rate of ``log(alpha)``.
        alpha_init: initial entropy temperature.
        autotune_alpha: learn ``alpha`` towards the target entropy; ``False`` keeps ``alpha_init``.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    num_qvalue_nets: int = 2
    alpha_lr: float = 3e-4
    alpha_init: float = 1.0
    autotune_alpha: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.num_qvalue_nets >= 1, "num_qvalue_nets", self.num_qvalue_nets, "must be >= 1")
        _check(self.alpha_init > 0, "alpha_init", self.alpha_init, "must be > 0")


@dataclass(frozen=True, kw_only=True)
class DeterministicActorCriticHParams(ActorCriticHParams):
    """TD3's and DDPG's: one MLP width for actor and critics, Gaussian exploration noise.

    Attributes:
        hidden_sizes: hidden widths of the actor and of each critic.
        exploration_noise: std of the Gaussian noise ``act`` adds, in ``[-1, 1]`` action units.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    exploration_noise: float = 0.1

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.exploration_noise >= 0, "exploration_noise", self.exploration_noise, "must be >= 0")


def shares(*groups: type[HParams]) -> Callable[[_Cls], _Cls]:
    """Class decorator: the class's constructor takes the fields of ``groups`` through ``**shared``.

    Sets ``cls.__signature__`` to the constructor's own arguments followed by the groups' fields
    (keyword-only, with their defaults and resolved types), which is what ``inspect.signature(cls)``
    returns: the CLI checks the keys and types of ``algo.*`` against it, and the config tests its defaults.
    Sets ``cls.hparam_groups`` (what :func:`split_shared` builds). Subclasses inherit both: one that
    changes the constructor's arguments is decorated again.
    """

    def decorate(cls: _Cls) -> _Cls:
        own = inspect.signature(cls.__init__)
        params = [p for p in list(own.parameters.values())[1:] if p.kind is not p.VAR_KEYWORD]
        taken = {p.name for p in params}
        for group in groups:
            hints = typing.get_type_hints(group)
            for f in dataclasses.fields(group):
                if f.name in taken:
                    raise TypeError(f"{cls.__name__} lists {f.name!r}, a field of {group.__name__}, itself.")
                taken.add(f.name)
                params.append(
                    inspect.Parameter(
                        f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name]
                    )
                )
        cls.__signature__ = inspect.Signature(params)
        cls.hparam_groups = groups
        return cls

    return decorate


def split_shared(cls: type, shared: dict[str, Any]) -> tuple[HParams, ...]:
    """The groups of ``cls`` (:func:`shares`) built from ``shared``, the constructor's ``**shared``.

    Raises:
        TypeError: a key that is no field of any group (as Python does for an unknown argument).
        ValueError: a value a group rejects.
    """
    groups: tuple[type[HParams], ...] = cls.hparam_groups
    known = {name for group in groups for name in group.field_names()}
    unknown = sorted(set(shared) - known)
    if unknown:
        raise TypeError(f"{cls.__name__}() got unexpected keyword arguments {unknown}.")
    return tuple(group(**{k: v for k, v in shared.items() if k in group.field_names()}) for group in groups)


def save_hparams(module: RLModule, *groups: HParams) -> None:
    """Records the calling constructor's arguments and every field of ``groups`` in ``module.hparams``.

    Flat, in the order of the class's signature (its arguments only), defaults included (``**shared``
    holds only the keys given): a checkpoint's ``hyper_parameters`` then rebuild the module as they did
    when the constructors listed every argument. Not logged: the run's resolved config is logged once,
    flattened.
    """
    frame = inspect.currentframe()
    caller = frame.f_back if frame is not None else None
    given: dict[str, Any] = {}
    # The arguments of every constructor in the chain that called this one, as save_hyperparameters
    # collects them (``**shared`` flattened), outermost last.
    for args in collect_init_args(caller, [], classes=(HyperparametersMixin,)):
        given.update(args)
    for group in groups:
        given.update(group.as_dict())
    # The class's arguments only: a family base's own argument that a subclass fixes (DDPG's policy delay)
    # is no argument of the subclass.
    params = inspect.signature(type(module)).parameters
    hparams = {k: given[k] for k in params if k in given and k not in SPEC_ARGS}
    module.save_hyperparameters(hparams, frame=caller, logger=False)


def vector_obs_dim(module: RLModule, name: str) -> int:
    """The size of ``module``'s vector observation.

    Raises:
        IncompatibleEnvError: an observation of another rank (images need an encoder this family lacks).
    """
    if len(module.obs_shape) != 1:
        raise IncompatibleEnvError(
            f"{name} takes vector observations, got shape {tuple(module.obs_shape)}; "
            "flatten the observation with a gymnasium wrapper."
        )
    return int(module.obs_shape[0])
