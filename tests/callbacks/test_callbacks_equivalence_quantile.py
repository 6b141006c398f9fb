"""Optimization callbacks change speed, not results: C51, Rainbow, QR-DQN, IQN and AC-IQN, with and without
each.

The harness is the one of ``tests/helpers/equivalence.py``: the module built from its experiment's
config with a fixed seed, ``K`` updates by a real ``lightning.Trainer`` on fixed batches, ``act`` on fixed
observations after every update. The random draws inside the hot paths (IQN's fractions, Rainbow's noise,
AC-IQN's smoothing and exploration noise) are the same with and without a callback (compile draws them
with eager's generator), so losses and exploring actions compare too. The hard target copy of the
discrete members happens every 2 updates, and AC-IQN runs with ``policy_delay=2``, so the ``K`` updates
take both its critic-only and its full variant.

- ``FusedOptimizer`` and ``TorchCompile`` (default mode): float32 rounding only. Compiling ``update``
  takes tens of seconds per algorithm on this 2-core CPU, so those tests are marked ``slow``; compiling
  ``act`` alone runs always.
- ``MixedPrecision`` (bf16): looser bounds on the first update's loss, on the direction of the parameter
  change and on the share of equal actions.
- CUDA graphs against eager, and after compile against compile alone, on a GPU (``gpu``, skipped without
  CUDA).
"""

from __future__ import annotations

import pytest
from helpers.equivalence import (
    QUANTILE_BF16,
    FamilyEquivalence,
    Result,
    assert_close_runs,
    quantile_data,
    run,
)

from callbacks import CudaGraphs, TorchCompile

DISCRETE = ["device=cpu", "algo.hidden_sizes=[32,32]", "algo.hard_update_every=2"]
EPS = ["algo.eps_start=0.3", "algo.eps_end=0.3"]  # random and greedy actions both exercised
SMALL_IQN = ["algo.n_quantiles=8", "algo.n_target_quantiles=8", "algo.n_policy_quantiles=8", "algo.n_cos=16"]
EXPERIMENTS = {
    "c51": ["+experiment=c51_cartpole", *DISCRETE, *EPS],
    "rainbow": ["+experiment=rainbow_cartpole", *DISCRETE],
    "qrdqn": ["+experiment=qrdqn_cartpole", *DISCRETE, *EPS],
    "iqn": ["+experiment=iqn_cartpole", *DISCRETE, *EPS, *SMALL_IQN, "algo.risk=cvar", "algo.risk_param=0.5"],
    "aciqn": [
        "+experiment=aciqn_pendulum", "device=cpu", "algo.actor_hidden_sizes=[32,32]",
        "algo.critic_hidden_sizes=[32,32]", *SMALL_IQN, "algo.policy_delay=2",
    ],
}  # fmt: skip


class TestQuantileCallbacks(FamilyEquivalence):
    EXPERIMENTS = EXPERIMENTS
    EXACT_ACTIONS = frozenset(EXPERIMENTS) - {"aciqn"}
    BF16 = QUANTILE_BF16  # measured in helpers/equivalence.py
    make_data = staticmethod(quantile_data)

    def loss_key(self, name: str) -> str:
        return "loss_qvalue" if name == "aciqn" else "loss"


# ------------------------------------------------------------------------------------------------ GPU
GPU_K = 12  # enough calls that each update variant (AC-IQN: critic-only and full) is captured and replayed


def run_gpu(overrides: list[str], callbacks: list) -> Result:
    return run(overrides, quantile_data, callbacks, device="cuda", updates=GPU_K)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_cuda_graphs_match_eager(name: str) -> None:
    graphs = CudaGraphs(warmup=3)
    ref = run_gpu(EXPERIMENTS[name], [])
    other = run_gpu(EXPERIMENTS[name], [graphs])
    # update (AC-IQN: critic-only and full) and act on the training observations.
    assert graphs.graphs_captured == (3 if name == "aciqn" else 2)
    assert graphs.graph_replays > 0  # the positive control: calls were answered by graph replays
    assert_close_runs(ref, other, atol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_cuda_graphs_after_compile_match_compile(name: str) -> None:
    """Capturing and replaying the compiled hot paths changes nothing.

    The compiled run is the reference, not eager: on CUDA, Inductor's scheduler can reorder the random ops
    of one compiled function even with ``fallback_random`` (pytorch/pytorch#181136, seen on torch 2.11 on an
    H200), so a hot path with several draws (epsilon-greedy's action and coin, Rainbow's noise per layer)
    takes the same numbers in another order than eager does. Compile against eager, draws included, is
    ``test_compile_matches`` on the CPU.
    """
    graphs = CudaGraphs(warmup=3)
    ref = run_gpu(EXPERIMENTS[name], [TorchCompile(mode="default")])
    other = run_gpu(EXPERIMENTS[name], [TorchCompile(mode="default"), graphs])
    assert graphs.graphs_captured == (3 if name == "aciqn" else 2)
    assert graphs.graph_replays > 0  # the positive control: calls were answered by graph replays
    assert_close_runs(ref, other, atol=1e-4)
