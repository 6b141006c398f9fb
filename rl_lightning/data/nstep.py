"""n-step returns over collected batches, exact across batch boundaries and episode ends.

TorchRL's ``MultiStepTransform`` keeps the per-step ``done`` flags of the first step of each window, so a
window that reaches a terminal step still bootstraps from the terminal observation. This transform marks
such windows ``terminated`` (and ``truncated``/``done`` as the last step of the window says), which is what
an n-step TD target needs.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

__all__ = ["NStepReturns"]

_END_KEYS = ("done", "terminated", "truncated")


class NStepReturns:
    """Turns collected ``[N, T]`` batches into n-step transitions.

    For step ``t`` the window is ``m = min(n, steps until the episode ends, inclusive)`` long and the
    output transition has ``("next", "reward") = sum_k gamma^k r_{t+k}``, ``("next", "observation")`` and
    the end flags of step ``t + m - 1``, and ``steps_to_next_obs = m`` (TorchRL's TD estimators discount the
    bootstrap by ``gamma ** steps_to_next_obs``). The last ``n - 1`` steps of a batch are held back and
    completed with the next batch, so windows never stop at a batch boundary.

    Args:
        n: window length (``n >= 1``).
        gamma: discount.
    """

    def __init__(self, n: int, gamma: float) -> None:
        if n < 1:
            raise ValueError("n-step length must be >= 1.")
        self.n = n
        self.gamma = gamma
        self._carry: TensorDictBase | None = None

    def reset(self) -> None:
        """Forgets held steps (the envs were restarted, so their windows will not continue)."""
        self._carry = None

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        """Returns the completed n-step transitions ``[N, T']`` for ``batch`` ``[N, T]``."""
        if self._carry is not None:
            batch = torch.cat([self._carry, batch], dim=1)
        length = batch.shape[1]
        ready = length - (self.n - 1)
        # The held-back steps are copied: the collector may write its next batch into the same buffers.
        if ready <= 0:
            self._carry = batch.clone()
            return batch[:, :0]
        self._carry = batch[:, ready:].clone() if self.n > 1 else None
        nxt = batch.get("next")
        reward = nxt.get("reward")  # [N, L, 1]
        done = nxt.get("done").to(reward.dtype)
        total = torch.zeros_like(reward[:, :ready])
        alive = torch.ones_like(total)  # 1 while the window has not passed an episode end
        steps = torch.zeros_like(total)
        for k in range(self.n):
            total = total + alive * (self.gamma**k) * reward[:, k : k + ready]
            steps = steps + alive
            alive = alive * (1.0 - done[:, k : k + ready])
        last = (torch.arange(ready, device=reward.device).view(1, ready, 1) + steps.long() - 1).squeeze(-1)
        out = batch[:, :ready].clone()
        idx = last  # [N, ready]
        out_next = out.get("next")
        for key, value in nxt.items(include_nested=True, leaves_only=True):
            if key == "reward":
                continue
            gathered = torch.gather(
                value,
                1,
                idx.view(*idx.shape, *([1] * (value.dim() - 2))).expand(*idx.shape, *value.shape[2:]),
            )
            out_next.set(key, gathered)
        out_next.set("reward", total)
        out.set("steps_to_next_obs", steps.long())
        return out
