"""``python -m rl_lightning <command> [hydra overrides]``: fit, evaluate, bench, doctor over one config.

The config is composed with Hydra's compose API from ``conf/`` (shipped beside the package), so the
commands work from any working directory and every user error is reported as one line with exit code 2.

Layering (no module imports upward): ``cli`` (this entry point) -> the command modules ``fit``,
``evaluate``, ``bench``, ``doctor`` -> ``run`` (building a run from the config) -> ``config``, ``process``
and the library (``algos``, ``data``, ``envs``, ``training``). Nothing outside ``cli`` imports it.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.config import CONF_DIR, CliError, chosen_keys, compose, experiments
from rl_lightning.cli.process import end_startup_pause, quiet_libraries, restore_process_settings

__all__ = ["COMMANDS", "CONF_DIR", "CliError", "compose", "experiments", "main", "require_run_choice"]

#: Commands whose start-up goes on after their imports: they end the collector's start-up pause themselves
#: once their run is built (``end_startup_pause``).
BUILDS_BEFORE_RUNNING = frozenset({"fit"})

#: Command name -> (module, function, help line). Modules are imported on use: ``--help`` stays fast.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "fit": (
        "rl_lightning.cli.fit",
        "fit",
        "train: python -m rl_lightning fit +experiment=dqn_cartpole [total_frames=...] [seed=...]\n"
        "             any gymnasium env: python -m rl_lightning fit algo=sac env.id=Pendulum-v1\n"
        "             resume: add ckpt_path=last (the newest run of that name) or ckpt_path=PATH",
    ),
    "evaluate": (
        "rl_lightning.cli.evaluate",
        "evaluate",
        "evaluate a checkpoint: python -m rl_lightning evaluate ckpt=PATH [episodes=N] [device=cpu]",
    ),
    "export": (
        "rl_lightning.cli.export",
        "export",
        "a standalone policy file: python -m rl_lightning export ckpt=PATH [export.format=torchscript|onnx]",
    ),
    "plot": (
        "rl_lightning.cli.plot",
        "plot",
        "learning curves over seeds: python -m rl_lightning plot plot.inputs=[benchmarks/results/X.json]",
    ),
    "report": (
        "rl_lightning.cli.report",
        "report",
        "learning figures over seeds with 95% intervals (IQM, mean, median; bootstrap):\n"
        "             python -m rl_lightning report report.inputs=[benchmarks/results/X.json,mlflow:RUN]",
    ),
    "bench": (
        "rl_lightning.cli.bench",
        "bench",
        "speed of each callback against none: python -m rl_lightning bench +experiment=dqn_cartpole\n"
        "             [bench.frames=N] [bench.variants=[compile,fast]] [bench.out=PATH]",
    ),
    "ui": (
        "rl_lightning.cli.ui",
        "ui",
        "MLflow's UI on this directory's runs; prints the address of their return curves\n"
        "             [ui.port=5000] [logger.tracking_uri=...]",
    ),
    "doctor": (
        "rl_lightning.cli.doctor",
        "doctor",
        "what this machine offers (CUDA, TF32, torch.compile, threads, versions) and advice",
    ),
}

USAGE = """usage: python -m rl_lightning COMMAND [OVERRIDES...] [--cfg job] [-m]

commands:
{commands}
options:
  --cfg job  print the composed config and exit
  -m         fit only: a Hydra multirun sweep (seed=0,1,2 ...; +hparams_search=NAME for Optuna)
  -h, --help this message

overrides use Hydra's syntax: key=value, group=option, +new_key=value.
experiments (+experiment=NAME):
{experiments}
view runs:   python -m rl_lightning ui   (from the directory you ran in)
"""


def _parse(argv: Sequence[str]) -> tuple[str, list[str], bool, bool]:
    """``(command, overrides, print the config, multirun)`` of the command line."""
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        return "help", [], False, False
    command, rest = args[0], args[1:]
    print_cfg = multirun = False
    overrides = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a in ("-h", "--help"):
            return "help", [], False, False
        if a in ("-m", "--multirun"):
            multirun = True
        elif a in ("--cfg", "-c"):
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
    return command, overrides, print_cfg, multirun


def _command(name: str) -> Callable[[DictConfig], Any]:
    module, function, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def _help_text() -> str:
    commands = "\n".join(f"  {name:<10} {doc}" for name, (_, _, doc) in COMMANDS.items())
    exps = "\n".join(f"  {name:<22} {doc}" for name, doc in experiments().items())
    return USAGE.format(commands=commands, experiments=exps)


def require_run_choice(overrides: Sequence[str]) -> None:
    """``fit`` without an experiment (or an algorithm and an env) would train an arbitrary default."""
    chosen = chosen_keys(overrides)
    if "experiment" in chosen or ("algo" in chosen and {"env", "env.id"} & chosen):
        return
    raise CliError(
        "fit needs an experiment or an algorithm and an env: python -m rl_lightning fit +experiment=NAME "
        f"(one of {', '.join(experiments())}), or fit algo=NAME env.id=GYMNASIUM_ID."
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    argv = sys.argv[1:] if argv is None else argv
    restore_logging = quiet_libraries()
    try:
        command, overrides, print_cfg, multirun = _parse(argv)
        if command == "help":
            print(_help_text())
            return 0
        if command not in COMMANDS:
            raise CliError(f"unknown command '{command}'; commands: {', '.join(COMMANDS)}.")
        if multirun and command != "fit":
            raise CliError(f"-m/--multirun sweeps over fit, not {command}.")
        if command == "fit" and not print_cfg:
            require_run_choice(overrides)
        if multirun:
            from rl_lightning.cli.sweep import multirun as sweep

            end_startup_pause()
            return sweep(overrides)
        cfg = compose(overrides)
        if print_cfg:
            print(OmegaConf.to_yaml(cfg))
            return 0
        run_command = _command(command)  # imports the command's libraries
        if command not in BUILDS_BEFORE_RUNNING:
            end_startup_pause()
        run_command(cfg)
        return 0
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Whatever read the output went away (`| head`, a parent process that ended): the command stops
        # writing, without a traceback, with the code a shell gives a command ended by SIGPIPE.
        return 128 + signal.SIGPIPE
    except Exception as e:
        from rl_lightning.cli.errors import USER_ERRORS

        if isinstance(e, USER_ERRORS) and not os.environ.get("RL_LIGHTNING_TRACEBACK"):
            print(f"error: {e}", file=sys.stderr)
            return 2
        raise
    finally:
        end_startup_pause()  # after an early return or an error, the collector is back on all the same
        restore_logging()
        restore_process_settings()
