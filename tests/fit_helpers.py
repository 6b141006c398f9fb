"""What the fits of the callback tests share: fixed batches as the train iterable and random transitions.

``K`` updates (and ``act`` calls) per run, on ``ACT_N`` observations each, unless a test says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from tensordict import TensorDict, TensorDictBase

K = 4  # updates (and act calls) per run
ACT_N = 32  # observations per act call


class FixedBatches:
    """The train iterable: the same ``K`` batches, cloned, every time."""

    def __init__(self, batches: list[TensorDictBase]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[TensorDictBase]:
        return (b.clone() for b in self.batches)


def transition_data(
    module: torch.nn.Module,
    k: int = K,
    *,
    seed: int,
    reward: Callable[..., torch.Tensor] = torch.randn,
    b: int = 64,
) -> tuple[list, list]:
    """``k`` batches of ``b`` random transitions (a tenth of them terminal; actions uniform over the
    module's action space, discrete or continuous; rewards ``reward(b, 1, generator=g)``) and ``k`` batches
    of ``ACT_N`` observations to act on, all drawn from one generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    obs_dim = int(module.obs_shape[0])
    discrete = hasattr(module, "n_actions")

    def action(n: int) -> torch.Tensor:
        if discrete:
            return torch.randint(0, module.n_actions, (n,), generator=g)
        return module.actions.to_env(2 * torch.rand(n, module.actions.action_dim, generator=g) - 1)

    def batch() -> TensorDict:
        term = torch.rand(b, 1, generator=g) < 0.1
        return TensorDict(
            {
                "observation": torch.randn(b, obs_dim, generator=g),
                "action": action(b),
                "next": {
                    "observation": torch.randn(b, obs_dim, generator=g),
                    "reward": reward(b, 1, generator=g),
                    "terminated": term,
                    "truncated": torch.zeros(b, 1, dtype=torch.bool),
                    "done": term.clone(),
                },
            },
            batch_size=[b],
        )

    obs = [TensorDict({"observation": torch.randn(ACT_N, obs_dim, generator=g)}, [ACT_N]) for _ in range(k)]
    return [batch() for _ in range(k)], obs
