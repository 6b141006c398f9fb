"""Type checks of the composed config, so that a wrong value is one line that names its key.

Hydra composes any string into any key (``total_frames=abc``); without these checks the mistake surfaces
later as a traceback from deep inside torch or Lightning that does not name the key. The root keys are
checked against :data:`ROOT_TYPES`, the dataclass-backed groups against their dataclass fields, and the
algorithm's keys against its constructor's annotations.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.config import CliError
from rl_lightning.data.datamodule import CollectConfig
from rl_lightning.data.replay import ReplayConfig
from rl_lightning.envs.factory import EnvConfig

__all__ = ["ROOT_TYPES", "check_config", "check_value"]

#: The root keys every command reads, with their types (``None``: the key may be null).
ROOT_TYPES: dict[str, Any] = {
    "name": str,
    "seed": int,
    "device": str,
    "total_frames": int,
    "torch_threads": int | None,
    "flush_denormal": bool,
    "progress_bar": bool,
    "log_every_n_updates": int,
    "split": str,
    "episodes": int | None,
    "eval_seed": int | None,
    "cpu_variant": str | None,
    "ckpt": str | None,
    "ckpt_path": str | None,
    "video": bool,
    "plan": bool | None,
    "risk": str | None,
    "risk_param": float | None,
}

_GROUP_TYPES: dict[str, type] = {"collect": CollectConfig, "replay": ReplayConfig, "env": EnvConfig}
_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def _describe(tp: Any) -> str:
    args = [a for a in typing.get_args(tp) if a is not type(None)] if _is_union(tp) else [tp]
    names = [_NAMES.get(a, getattr(a, "__name__", str(a))) for a in args]
    text = " or ".join(names)
    return text + " or null" if _is_union(tp) and type(None) in typing.get_args(tp) else text


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)


def _matches(value: Any, tp: Any) -> bool | None:
    """Whether ``value`` fits ``tp``; ``None`` when ``tp`` is not a type this check understands."""
    if tp is Any:
        return True
    if _is_union(tp):
        results = [_matches(value, arg) for arg in typing.get_args(tp)]
        return None if None in results and not any(results) else any(r for r in results if r)
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    origin = typing.get_origin(tp)
    if origin in (Sequence, list, tuple) or tp in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if len(args) == 1:
            return all(_matches(v, args[0]) is not False for v in value)
        return True
    if origin is Mapping or origin is dict or tp in (dict, Mapping):
        return isinstance(value, Mapping)
    return None


def check_value(key: str, value: Any, tp: Any) -> None:
    """Raises :class:`CliError` naming ``key`` when ``value`` does not fit the annotation ``tp``."""
    if _matches(value, tp) is False:
        raise CliError(f"{key}={value!r}: expected {_describe(tp)}.")


def _hints(obj: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(obj)
    except Exception:  # an annotation this module cannot resolve: no check rather than a false alarm
        return {}


def check_config(cfg: DictConfig) -> None:
    """Checks the root keys, the ``collect``/``replay``/``env`` groups and ``algo`` against their types.

    Raises:
        CliError: the first value of the wrong type, with its key.
    """
    data = OmegaConf.to_container(cfg, resolve=True)
    for key, tp in ROOT_TYPES.items():
        if key in data:
            check_value(key, data[key], tp)
    for group, cls in _GROUP_TYPES.items():
        hints = _hints(cls)
        for field in dataclasses.fields(cls):
            if field.name in (data.get(group) or {}):
                check_value(f"{group}.{field.name}", data[group][field.name], hints.get(field.name, Any))
    algo = data.get("algo") or {}
    target = algo.get("_target_")
    if not isinstance(target, str):
        return
    module, _, name = target.rpartition(".")
    try:
        cls = getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError):
        return  # instantiation reports it
    params = inspect.signature(cls).parameters
    # A class whose constructor takes shared settings as ``**shared`` publishes their types in its
    # signature (``rl_lightning.algos.hparams.shares``), resolved; its own arguments' come from ``__init__``.
    hints = {k: p.annotation for k, p in params.items() if p.annotation is not p.empty}
    hints = {k: tp for k, tp in hints.items() if not isinstance(tp, str)} | _hints(cls.__init__)
    for key, value in algo.items():
        if key.startswith("_"):
            continue
        if key not in params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            close = difflib.get_close_matches(key, [k for k in params if not k.endswith("_spec")], n=3)
            hint = f" did you mean {', '.join(f'algo.{c}' for c in close)}?" if close else ""
            raise CliError(f"algo.{key} is not an argument of {name};{hint} see conf/algo/ for its keys.")
        if key in hints:
            check_value(f"algo.{key}", value, hints[key])
