"""User errors: what the CLI prints as one line with exit code 2 instead of a traceback."""

from __future__ import annotations

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.cli.config import CliError
from rl_lightning.data.replay import ReplayMismatchError
from rl_lightning.envs.factory import UnknownEnvError
from rl_lightning.training.video import VideoError

__all__ = ["USER_ERRORS"]

#: Exceptions that are the user's to fix: the CLI prints them as one line.
USER_ERRORS: tuple[type[BaseException], ...] = (
    CliError,
    UnknownEnvError,
    IncompatibleEnvError,
    ReplayMismatchError,
    VideoError,
    FileNotFoundError,
    ValueError,
)
