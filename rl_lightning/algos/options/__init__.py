"""SAC with options (soft option-critic): the module and its math."""

from rl_lightning.algos.options.module import OPTION_AGE_KEY, OPTION_KEY, SACOptions

__all__ = ["OPTION_AGE_KEY", "OPTION_KEY", "SACOptions"]
