"""Composing the config: ``conf/`` with the command line's Hydra overrides; errors as one line."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

__all__ = ["CONF_DIR", "CliError", "chosen_keys", "compose", "experiments", "run_name"]


def _conf_dir() -> Path:
    """``rl_lightning/conf`` in an installed wheel, else ``conf/`` of the source checkout (editable)."""
    package = Path(__file__).resolve().parents[1]
    packaged = package / "conf"
    return packaged if packaged.is_dir() else package.parent / "conf"


CONF_DIR = _conf_dir()


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def experiments() -> dict[str, str]:
    """Experiment names with the first comment line of their file."""
    out = {}
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        comments = [ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]
        out[path.stem] = next((c for c in comments if not c.startswith("@package")), "")
    return out


def chosen_keys(overrides: Sequence[str]) -> set[str]:
    """The keys and groups the overrides set (``+experiment=x``: ``experiment``; ``env.id=y``: ``env.id``)."""
    return {o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o}


def run_name(algo: str, env_id: str) -> str:
    """A run's name from its algorithm and env: ``sac`` and ``MountainCarContinuous-v0`` ->
    ``sac_mountaincarcontinuous_v0``."""
    return f"{algo}_{re.sub(r'[^a-z0-9]+', '_', env_id.lower()).strip('_')}"


def _unknown_key(key: str, others: list[str]) -> str:
    """The line for an unknown ``key``: the close names beside it in the config the other overrides
    compose, and, except for an algorithm's keys (its constructor's arguments, which take no new ones), how
    to add a new key."""
    parent, _, leaf = key.rpartition(".")
    try:
        node = OmegaConf.select(compose(others), parent) if parent else compose(others)
    except CliError:
        node = None
    names = [str(k) for k in node] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(leaf, names, n=3)
    hint = f" did you mean {', '.join(f'{parent}.{c}' if parent else c for c in close)}?" if close else ""
    if parent == "algo":
        return (
            f"unknown config key '{key}': the algorithm takes no such argument;{hint} (its keys: conf/algo/)"
        )
    return f"unknown config key '{key}';{hint or ' check the spelling,'} or add a new key with +{key}=..."


def compose(overrides: Sequence[str]) -> DictConfig:
    """Composes ``conf/config.yaml`` with ``overrides``; Hydra's errors become :class:`CliError`.

    Any gymnasium id runs without an env group of its own: ``env.id=ID`` without ``env=...`` or an
    experiment takes the generic ``env=gym``. A run is named after its algorithm and env
    (:func:`run_name`) unless ``name=`` is given or an experiment names it; an experiment whose
    ``env.id`` is overridden is named after the new env.
    """
    keys = chosen_keys(overrides)
    experiment = "experiment" in keys
    overrides = list(overrides)
    if "env.id" in keys and "env" not in keys and not experiment:
        overrides.insert(0, "env=gym")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import (
        ConfigCompositionException,
        HydraException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    if not CONF_DIR.is_dir():
        raise CliError(f"config directory {CONF_DIR} not found; install the project with `pip install -e .`.")
    for item in overrides:
        if item.startswith("+experiment=") or item.startswith("experiment="):
            name = item.split("=", 1)[1]
            if name not in experiments():
                raise CliError(f"unknown experiment '{name}'; available: {', '.join(experiments())}.")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = hydra_compose("config", overrides=overrides, return_hydra_config=True)
        algo = str(cfg.hydra.runtime.choices.get("algo"))
        with open_dict(cfg):
            del cfg["hydra"]
        if "name" not in keys and ("env.id" in keys or (not experiment and "algo" in keys)):
            cfg.name = run_name(algo, str(cfg.env.id))
        OmegaConf.resolve(cfg)
        return cfg
    except MissingConfigException as e:
        missing = str(e.missing_cfg_file or "")
        if "/" in missing and e.options:
            group, option = missing.split("/", 1)
            raise CliError(f"unknown {group} '{option}'; choose one of: {', '.join(e.options)}.") from None
        raise CliError(str(e).splitlines()[0]) from None
    except OverrideParseException as e:
        raise CliError(f"cannot parse override: {str(e).splitlines()[0]}") from None
    except ConfigCompositionException as e:
        msg = str(e.__cause__ or e).splitlines()[0]
        if "not in struct" in str(e.__cause__ or e) or "Could not override" in str(e):
            key = str(e).split("'")[1] if "'" in str(e) else "?"
            msg = _unknown_key(key, [o for o in overrides if chosen_keys([o]) != {key}])
        raise CliError(msg) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise CliError(str(e).splitlines()[0]) from None
