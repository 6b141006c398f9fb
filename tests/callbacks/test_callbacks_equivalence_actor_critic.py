"""Optimization callbacks change speed, not results: SAC, discrete SAC, TD3 and DDPG with and without each.

The harness is the one of ``tests/helpers/equivalence.py``: the module built from its experiment's
config with a fixed seed, ``K`` updates by a real ``lightning.Trainer`` on fixed batches, ``act`` on fixed
observations after every update. TD3 runs with ``policy_delay=2``, so its ``K`` updates take both the
critic-only and the full (critic, actor, targets) variants of ``update``. Stochastic acting draws the same
random numbers with and without a callback (compile draws them with eager's generator), so exploring
actions compare too.

- ``FusedOptimizer`` and ``TorchCompile`` (default mode): float32 rounding only. Compiling ``update``
  costs 45 to 100 s per algorithm on this 2-core CPU, so those four tests are marked ``slow``; compiling
  ``act`` takes a few seconds and runs always.
- ``MixedPrecision`` (bf16): looser bounds on the first update's losses and the direction of the
  parameter change.
- CUDA graphs (after compile), non-blocking transfers and TF32 on a GPU (``gpu``, skipped without CUDA):
  enough updates that both of TD3's update variants get captured and replayed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from helpers.equivalence import (
    ACTOR_CRITIC_BF16,
    FamilyEquivalence,
    Result,
    actor_critic_data,
    assert_acted,
    assert_close_runs,
    max_abs_diff,
    metrics_rel_diff,
    run,
)

from callbacks import (
    TF32,
    CudaGraphs,
    NonBlockingTransfer,
    TorchCompile,
)

SMALL = ["device=cpu", "algo.hidden_sizes=[32,32]"]
EXPERIMENTS = {
    "sac": ["+experiment=sac_pendulum", *SMALL],
    "sac_discrete": ["+experiment=sac_discrete_cartpole", *SMALL],
    "td3": ["+experiment=td3_pendulum", *SMALL, "algo.policy_delay=2"],
    "ddpg": ["+experiment=ddpg_pendulum", *SMALL],
}


class TestActorCriticCallbacks(FamilyEquivalence):
    EXPERIMENTS = EXPERIMENTS
    # DDPG runs DeterministicActorCritic's update, which TD3 (with its delayed actor: both branches) compiles.
    COMPILED = frozenset({"sac", "sac_discrete", "td3"})
    EXACT_ACTIONS = frozenset({"sac_discrete"})  # argmax of near-equal logits; continuous ones to EXACT_ATOL
    BF16 = ACTOR_CRITIC_BF16  # measured in helpers/equivalence.py
    make_data = staticmethod(actor_critic_data)


# ------------------------------------------------------------------------------------------------ GPU
GPU_K = 12  # TD3 alternates critic-only and full updates: 6 calls each, 3 of them replays after warm-up


def run_gpu(overrides: list[str], callbacks: list) -> Result:
    return run(overrides, actor_critic_data, callbacks, device="cuda", updates=GPU_K)


_GPU_CALLBACKS: dict[str, Callable[[], list]] = {
    "cuda_graphs": lambda: [TorchCompile(mode="default"), CudaGraphs(warmup=3)],
    "non_blocking": lambda: [NonBlockingTransfer()],
}


@pytest.mark.gpu
@pytest.mark.parametrize("callbacks", sorted(_GPU_CALLBACKS))
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_gpu_callbacks_match_eager(name: str, callbacks: str) -> None:
    ref = run_gpu(EXPERIMENTS[name], [])
    made = _GPU_CALLBACKS[callbacks]()
    other = run_gpu(EXPERIMENTS[name], made)
    assert len(other.metrics) == GPU_K
    assert_acted(made, batches=GPU_K)
    assert_close_runs(ref, other, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_cuda_graphs_capture_every_update_variant(name: str) -> None:
    graphs = CudaGraphs(warmup=2)
    ref = run_gpu(EXPERIMENTS[name], [])
    other = run_gpu(EXPERIMENTS[name], [graphs])
    # update (TD3: critic-only and full) and act on the training observations.
    assert graphs.graphs_captured == (3 if name == "td3" else 2)
    # The calls past each path's warm-up and capture were answered by replays: GPU_K updates and GPU_K act
    # calls, 3 calls each (2 warm-up, 1 capture) per captured variant before its first replay.
    assert graphs.graph_replays == 2 * GPU_K - 3 * graphs.graphs_captured
    assert_close_runs(ref, other, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_tf32_close(name: str) -> None:
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs an Ampere or newer GPU: before one the callback changes nothing")
    ref, other = run_gpu(EXPERIMENTS[name], []), run_gpu(EXPERIMENTS[name], [TF32()])
    # TF32 matmuls keep 10 mantissa bits: the first update's losses agree to about 1e-3, and differ (the
    # lower bound, TF32's positive control: a callback that set no flag would give the same losses).
    assert 0 < metrics_rel_diff(ref, other, step=0, keys=["loss_qvalue"]) < 1e-2
    assert max_abs_diff(ref.after, other.after) > 0
    assert max((a - b).abs().max().item() for a, b in zip(ref.actions, other.actions)) < 0.05
