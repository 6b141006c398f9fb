"""Argument checks of :class:`rl_lightning.algos.options.SACOptions` (those its own arguments need; the
shared ones are :class:`~rl_lightning.algos.hparams.SoftActorCriticHParams`'s): one line that says what
to do."""

from __future__ import annotations

from typing import Any

from rl_lightning.algos.options.math import OPTION_POLICIES

__all__ = ["TERMINATIONS", "check_arguments"]

#: ``learned``: the termination gradient; ``never``: ``β ≡ 0``, an option lasts its episode.
TERMINATIONS = ("learned", "never")

# name -> (is it valid, what it must be)
_RULES = {
    "num_options": (lambda v: v >= 1, "must be >= 1"),
    "option_policy": (lambda v: v in OPTION_POLICIES, f"must be one of {OPTION_POLICIES}"),
    "option_temperature": (lambda v: v > 0, "must be > 0"),
    "option_epsilon": (lambda v: 0.0 <= v <= 1.0, "must lie in [0, 1]"),
    "terminations": (lambda v: v in TERMINATIONS, f"must be one of {TERMINATIONS}"),
    "num_envs": (lambda v: v >= 1, "must be >= 1 (env.num_envs)"),
}


def check_arguments(args: dict[str, Any]) -> None:
    """Raises ``ValueError`` for a bad value.

    Args:
        args: the constructor's arguments by name (its ``locals()``).
    """
    for name, (valid, rule) in _RULES.items():
        if not valid(args[name]):
            raise ValueError(f"algo.{name}={args[name]!r} {rule}.")
