"""n-step returns over collected batches, exact across batch boundaries and episode ends.

TorchRL's ``MultiStepTransform`` keeps the per-step ``done`` flags of the first step of each window, so a
window that reaches a terminal step still bootstraps from the terminal observation. This transform marks
such windows ``terminated`` (and ``truncated``/``done`` as the last step of the window says), which is what
an n-step TD target needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

__all__ = ["NStepReturns"]

_END_KEYS = ("done", "terminated", "truncated")


def _key(key: Any) -> Any:
    """A nested key read back from a checkpoint (a list where a tuple was saved) as a tuple."""
    return tuple(key) if isinstance(key, list) else key


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
        self._carry: dict[Any, torch.Tensor] | None = None  # the held-back steps, entry by entry

    def reset(self) -> None:
        """Forgets held steps (the envs were restarted, so their windows will not continue)."""
        self._carry = None

    def state_dict(self) -> dict[str, Any]:
        """The held-back steps (``carry``: ``[key, tensor]`` pairs, ``None`` when none are held)."""
        carry = None if self._carry is None else [[key, value] for key, value in self._carry.items()]
        return {"carry": carry}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the held-back steps of :meth:`state_dict` (of envs that continue where they were)."""
        carry = state["carry"]
        self._carry = None if carry is None else {_key(key): value for key, value in carry}

    def __call__(self, batch: TensorDictBase, keys: Sequence[Any] | None = None) -> TensorDictBase:
        """Returns the completed n-step transitions ``[N, T']`` for ``batch`` ``[N, T]``.

        ``keys`` are the entries the transitions keep (``None``: all; absent ones are skipped); the reward
        and ``done`` of the next step are read in any case. The ingestion passes the keys the replay
        stores, so that the entries it drops are neither held back nor gathered.

        It works on the entries' tensors and builds one ``TensorDict`` at the end: TensorDict's own ``cat``,
        indexing and ``clone`` check and dispatch per entry, which cost most of the call for the few frames
        of a collection (``benchmarks/results/nstep.json``).
        """
        if keys is None:
            leaves = dict(batch.items(include_nested=True, leaves_only=True))
        else:
            wanted = dict.fromkeys([*keys, ("next", "reward"), ("next", "done")])
            leaves = {key: value for key in wanted if (value := batch.get(key, None)) is not None}
        if self._carry is not None:
            leaves = {key: torch.cat([self._carry[key], value], dim=1) for key, value in leaves.items()}
        length = next(iter(leaves.values())).shape[1]
        ready = length - (self.n - 1)
        # The held-back steps are copied: the collector may write its next batch into the same buffers.
        if ready <= 0:
            self._carry = {key: value.clone() for key, value in leaves.items()}
            return batch[:, :0]
        self._carry = {key: value[:, ready:].clone() for key, value in leaves.items()} if self.n > 1 else None
        reward = leaves["next", "reward"]  # [N, L, 1]
        done = leaves["next", "done"].to(reward.dtype)
        total = torch.zeros_like(reward[:, :ready])
        alive = torch.ones_like(total)  # 1 while the window has not passed an episode end
        steps = torch.zeros_like(total)
        for k in range(self.n):
            total = total + alive * (self.gamma**k) * reward[:, k : k + ready]
            steps = steps + alive
            alive = alive * (1.0 - done[:, k : k + ready])
        # The last step of each window, whose next observation and end flags the transition takes.
        last = (torch.arange(ready, device=reward.device).view(1, ready, 1) + steps.long() - 1).squeeze(-1)
        tree: dict[str, Any] = {"steps_to_next_obs": steps.long()}
        for key, value in leaves.items():
            path = (key,) if isinstance(key, str) else key
            if path == ("next", "reward"):
                value = total
            elif path[0] == "next":
                index = last.view(*last.shape, *([1] * (value.dim() - 2))).expand(
                    *last.shape, *value.shape[2:]
                )
                value = torch.gather(value, 1, index)
            else:
                value = value[:, :ready]
            branch = tree
            for part in path[:-1]:
                branch = branch.setdefault(part, {})
            branch[path[-1]] = value
        return TensorDict(tree, batch_size=[batch.shape[0], ready], device=batch.device)
