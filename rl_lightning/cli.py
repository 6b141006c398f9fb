"""``python -m rl_lightning <command> [hydra overrides]``: fit, evaluate, bench, doctor over one config.

The config is composed with Hydra's compose API from ``conf/`` (shipped beside the package), so the
commands work from any working directory and every error is reported as one line with a non-zero exit.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

__all__ = ["CONF_DIR", "CliError", "compose", "main"]

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

USAGE = """usage: python -m rl_lightning COMMAND [OVERRIDES...] [--cfg job]

commands:
  fit        train: python -m rl_lightning fit +experiment=dqn_cartpole [total_frames=...] [seed=...]
             resume: add ckpt_path=last (the newest run of that name) or ckpt_path=PATH
  evaluate   evaluate a checkpoint: python -m rl_lightning evaluate ckpt=PATH [episodes=N] [device=cpu]
{extra}
options:
  --cfg job  print the composed config and exit
  -h, --help this message

overrides use Hydra's syntax: key=value, group=option, +new_key=value.
experiments (+experiment=NAME):
{experiments}
view runs:   mlflow ui --backend-store-uri sqlite:///mlflow.db   (from the directory you ran in)
"""


class CliError(Exception):
    """A user error: printed as one line, exit code 2."""


def experiments() -> dict[str, str]:
    """Experiment names with the first comment line of their file."""
    out = {}
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        comments = [ln.lstrip("# ").strip() for ln in path.read_text().splitlines() if ln.startswith("#")]
        out[path.stem] = next((c for c in comments if not c.startswith("@package")), "")
    return out


def compose(overrides: Sequence[str]) -> DictConfig:
    """Composes ``conf/config.yaml`` with ``overrides``; Hydra's errors become :class:`CliError`."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import ConfigCompositionException, HydraException, OverrideParseException
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
            cfg = hydra_compose("config", overrides=list(overrides))
        OmegaConf.resolve(cfg)
        return cfg
    except OverrideParseException as e:
        raise CliError(f"cannot parse override: {str(e).splitlines()[0]}") from None
    except ConfigCompositionException as e:
        msg = str(e.__cause__ or e).splitlines()[0]
        if "not in struct" in str(e.__cause__ or e) or "Could not override" in str(e):
            key = str(e).split("'")[1] if "'" in str(e) else "?"
            msg = f"unknown config key '{key}'; check the spelling, or add a new key with +{key}=..."
        raise CliError(msg) from None
    except (HydraException, OmegaConfBaseException) as e:
        raise CliError(str(e).splitlines()[0]) from None


def _parse(argv: Sequence[str]) -> tuple[str, list[str], bool]:
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        return "help", [], False
    command, rest = args[0], args[1:]
    print_cfg = False
    overrides = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("-h", "--help"):
            return "help", [], False
        if a in ("--cfg", "-c"):
            print_cfg = True
            if i + 1 < len(rest) and rest[i + 1] in ("job", "all"):
                i += 1
        elif a.startswith("--cfg="):
            print_cfg = True
        elif a.startswith("-"):
            raise CliError(f"unknown option '{a}'; see `python -m rl_lightning --help`.")
        else:
            overrides.append(a)
        i += 1
    return command, overrides, print_cfg


def _commands() -> dict[str, Callable[[DictConfig], Any]]:
    from rl_lightning import commands

    return {"fit": commands.fit, "evaluate": commands.evaluate, **commands.EXTRA_COMMANDS}


def _help_text() -> str:
    from rl_lightning import commands

    extra = "\n".join(f"  {name:<10} {doc}" for name, doc in commands.EXTRA_HELP.items())
    exps = "\n".join(f"  {name:<22} {doc}" for name, doc in experiments().items())
    return USAGE.format(extra=extra, experiments=exps)


class _DropAdverts(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in record.getMessage()


def _quiet_libraries() -> None:
    """Keeps the console to what matters for a run (process-wide settings belong to the CLI)."""
    # Both libraries read these when first imported, so they are set before any import of them.
    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("RL_WARNINGS", "False")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    for name in ("torchrl", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_DropAdverts())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    _quiet_libraries()
    try:
        command, overrides, print_cfg = _parse(argv)
        if command == "help":
            print(_help_text())
            return 0
        commands = _commands()
        if command not in commands:
            raise CliError(f"unknown command '{command}'; commands: {', '.join(commands)}.")
        cfg = compose(overrides)
        if print_cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        commands[command](cfg)
        return 0
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        from rl_lightning.commands import USER_ERRORS

        if isinstance(e, USER_ERRORS) and not os.environ.get("RL_LIGHTNING_TRACEBACK"):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
