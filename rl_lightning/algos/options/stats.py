"""Option usage over the last acting steps, kept on the device by ``act`` and read by ``update``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["OptionUsage"]


class OptionUsage(nn.Module):
    """A ring buffer of the last ``window`` (env, step) entries: the active option and whether it started.

    ``record`` writes ``N`` entries per acting call with one ``index_copy_`` (no host sync, static shapes,
    so it sits inside compiled and graphed ``act``); ``summary`` reduces the buffer on the device.

    Args:
        num_options: ``K``.
        window: entries kept (the last ``window`` env steps, all envs together).

    Buffers:
        option: ``[window]`` int64, ``-1`` where nothing was written yet.
        started: ``[window]`` bool, the option started at that step (an episode start or a termination).
        count: ``[]`` int64, entries ever written.
    """

    option: Tensor
    started: Tensor
    count: Tensor

    def __init__(self, num_options: int, window: int) -> None:
        super().__init__()
        if window < 1:
            raise ValueError(f"algo.usage_window={window} must be >= 1.")
        self.num_options, self.window = num_options, window
        self.register_buffer("option", torch.full((window,), -1, dtype=torch.int64))
        self.register_buffer("started", torch.zeros(window, dtype=torch.bool))
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def record(self, option: Tensor, started: Tensor) -> None:
        """Appends ``option [N]`` and ``started [N]`` (``N <= window``), overwriting the oldest entries."""
        n = option.numel()
        idx = (self.count + torch.arange(n, device=option.device)) % self.window
        self.option.index_copy_(0, idx, option.reshape(-1))
        self.started.index_copy_(0, idx, started.reshape(-1))
        self.count.add_(n)

    def summary(self) -> dict[str, Tensor]:
        """Usage and duration over the recorded window (zeros before anything was recorded).

        Returns:
            ``options/usage_<k>`` (each option's share of the steps), ``options/usage_min`` and
            ``options/duration_mean`` (steps per option start: the mean number of steps an option runs).
        """
        valid = self.option >= 0
        one_hot = F.one_hot(self.option.clamp_min(0), self.num_options).float() * valid.unsqueeze(-1)
        steps = valid.sum().float()
        usage = one_hot.sum(0) / steps.clamp_min(1.0)
        out = {f"options/usage_{k}": usage[k] for k in range(self.num_options)}
        out["options/usage_min"] = usage.min()
        out["options/duration_mean"] = steps / (self.started & valid).sum().float().clamp_min(1.0)
        return out
