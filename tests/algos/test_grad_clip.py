"""Every algorithm clips its gradients to ``algo.grad_clip`` before each optimizer step it clips.

The norm an optimizer sees is recorded at the step itself (a global optimizer step pre-hook), after the
algorithm clipped: it must be at most the limit for every network the algorithm clips. The limit is set far
below the gradients of a first update, so clipping has to act, and the norm the update reports (before
clipping) is above it. Without clipping the same steps see norms above the limit: the check can fail.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from helpers.equivalence import ALGORITHMS
from tensordict import TensorDictBase
from torch.optim.optimizer import register_optimizer_step_pre_hook

from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config

LIMIT = 1e-3
#: Parameters no algorithm clips: the entropy temperatures, learned on a loss of their own.
UNCLIPPED = ("log_alpha",)


@contextmanager
def step_norms(module: torch.nn.Module) -> Iterator[list[tuple[tuple[str, ...], float]]]:
    """Records, at every optimizer step, the names of the parameters it steps and their total gradient
    norm."""
    names = {p: n for n, p in module.named_parameters()}
    seen: list[tuple[tuple[str, ...], float]] = []

    def pre_step(optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        if params:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
            seen.append((tuple(names[p] for p in params), float(norm)))

    handle = register_optimizer_step_pre_hook(pre_step)
    try:
        yield seen
    finally:
        handle.remove()


def updates(name: str, grad_clip: float | None) -> tuple[list, list[TensorDictBase]]:
    """Two updates of ``name``'s module (built from its experiment) with ``algo.grad_clip``: the steps'
    recorded norms and the updates' metrics."""
    overrides, make_data = ALGORITHMS[name]
    cfg = compose([*overrides, "device=cpu", f"algo.grad_clip={'null' if grad_clip is None else grad_clip}"])
    torch.manual_seed(0)
    module = build_module(cfg, env_config(cfg))
    batches, _ = make_data(module, k=2)
    with step_norms(module) as seen:
        metrics = [module.update(module.prepare_sample(b.clone())) for b in batches]
    return seen, metrics


def clipped_steps(seen: list) -> list[tuple[tuple[str, ...], float]]:
    return [(names, norm) for names, norm in seen if not all(n.endswith(UNCLIPPED) for n in names)]


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_clipped_step_sees_at_most_the_limit(name: str) -> None:
    seen, metrics = updates(name, LIMIT)
    steps = clipped_steps(seen)
    assert steps, "no optimizer step recorded"
    for names, norm in steps:
        assert norm <= LIMIT * (1 + 1e-4), (names[:3], norm)
    reported = [float(v) for m in metrics for k, v in m.items() if k.startswith("grad_norm")]
    assert reported and max(reported) > LIMIT  # the norms before clipping: clipping did act


def test_without_clipping_the_steps_see_larger_norms() -> None:
    seen, _ = updates("sac", None)
    assert max(norm for _, norm in clipped_steps(seen)) > LIMIT
