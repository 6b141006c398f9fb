"""Optimization callbacks change speed, not results: SAC with options with and without each of them.

The harness of ``tests/helpers/equivalence.py``: the module built from its experiment's config with
a fixed seed, ``K`` updates by a real ``lightning.Trainer`` on fixed batches, ``act`` on fixed
observations after every update. The batches carry the option that acted (and some warm-up rows
without one), so every loss, the termination loss included, runs; ``act`` samples terminations, options
and actions and moves the per-env option state and the usage window, whose figures are among the
metrics compared. Continuous (Pendulum) and discrete (CartPole) actions.

- ``FusedOptimizer`` and ``TorchCompile`` (default mode): float32 rounding only. Compiling ``update``
  takes minutes on a 2-core CPU: marked ``slow``; compiling ``act`` runs always.
- ``MixedPrecision`` (bf16): looser bounds on the first update's critic loss and on the direction of the
  parameter change; continuous actions within a small share of the range, discrete ones mostly equal.
- CUDA graphs (after compile) and non-blocking transfers on a GPU (``gpu``, skipped without CUDA).
"""

from __future__ import annotations

import pytest
import torch
from helpers.equivalence import (
    ACTOR_CRITIC_BF16,
    FamilyEquivalence,
    Result,
    assert_acted,
    assert_close_runs,
    options_data,
    run,
)
from helpers.fit import ACT_N

from callbacks import (
    CudaGraphs,
    NonBlockingTransfer,
    TorchCompile,
)

SMALL = ["device=cpu", "algo.hidden_sizes=[32,32]", f"algo.num_envs={ACT_N}", "algo.usage_window=256"]
EXPERIMENTS = {
    "continuous": ["+experiment=sac_options_pendulum", *SMALL],
    "discrete": ["+experiment=sac_options_pendulum", "env=cartpole", *SMALL],
}


class TestOptionsCallbacks(FamilyEquivalence):
    EXPERIMENTS = EXPERIMENTS
    EXACT_ACTIONS = frozenset({"discrete"})
    BF16 = ACTOR_CRITIC_BF16
    make_data = staticmethod(options_data)  # the actor-critic batches with the acting option

    def test_reference_exercises_every_loss_and_option_metric(self, name: str) -> None:
        ref = self.reference(name)
        for metrics in ref.metrics:
            assert metrics["loss_termination"] != 0 and torch.isfinite(metrics["loss_qvalue"])
        # act runs after each update: from the second update on the usage window holds its steps.
        assert all(m["options/duration_mean"] >= 1 for m in ref.metrics[1:])
        changed = [
            k for k, v in ref.before.items() if v.is_floating_point() and not torch.equal(v, ref.after[k])
        ]
        assert any(k.startswith("termination_net") for k in changed)
        assert any(k.startswith("target_critic") for k in changed)


# ------------------------------------------------------------------------------------------------ GPU
GPU_K = 8


def run_gpu(overrides: list[str], callbacks: list) -> Result:
    return run(overrides, options_data, callbacks, device="cuda", updates=GPU_K)


@pytest.mark.gpu
@pytest.mark.parametrize("callbacks", ["cuda_graphs", "non_blocking"])
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_gpu_callbacks_match_eager(name: str, callbacks: str) -> None:
    make = {
        "cuda_graphs": lambda: [TorchCompile(mode="default"), CudaGraphs(warmup=3)],
        "non_blocking": lambda: [NonBlockingTransfer()],
    }[callbacks]
    made = make()
    ref, other = run_gpu(EXPERIMENTS[name], []), run_gpu(EXPERIMENTS[name], made)
    assert len(other.metrics) == GPU_K
    assert_acted(made, batches=GPU_K)
    assert_close_runs(ref, other, atol=1e-4)
