"""Optimization callbacks change speed, not results: the real algorithms with and without each of them.

Each module is built from its experiment's config with a fixed seed and trained by a real
``lightning.Trainer`` on a fixed sequence of ``K`` batches; after every update a recorder calls ``act`` on
fixed observations (the wrapped ``act`` is in place during the fit, as during collection). The parameters
after the fit, the metrics of every update and every action must match the run without callbacks:

- ``FusedOptimizer``: one fused Adam kernel instead of the for-loop one; rounding only.
- ``DirectSteps``: the same optimizer steps without Lightning's hook dispatch; identical results.
- ``TorchCompile`` (mode ``default``): inductor reorders and fuses float32 ops (DQN's update; TD-MPC2's
  and the families' are traced with ``aot_eager``, without code generation, which costs minutes on a cold
  cache). Inductor also draws random numbers its own way, so the test sets
  ``torch._inductor.config.fallback_random`` to draw them with eager's generator: with it, exploring
  actions use the same samples.
- ``MixedPrecision`` (bf16): 8 mantissa bits in matmuls; a looser test on the parameter *changes*
  (relative error) and on the share of equal actions.

The harness (``run``, the comparisons and their bounds, the DQN and TD-MPC2 cases) is
``tests/helpers/equivalence.py``. The families of ``test_callbacks_equivalence_{actor_critic,quantile,
options}.py`` run the first four of these through its ``FamilyEquivalence`` (a ``Test...`` class per
family, one case per experiment), and their GPU tests through ``run(..., device="cuda")``.

The end of the file runs ``fit`` through the real CLI with the CPU-acting callbacks and resumes it with
``ckpt_path=last``: the callbacks' state (compile time, throughput counters) and the fused optimizer state
come back and carry on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.cli import run_main
from helpers.equivalence import (
    BF16_ACTIONS,
    BF16_COSINE_TDMPC2,
    BF16_FIRST_LOSS,
    BF16_PLAN_GAP,
    BF16_REL,
    BF16_SIGNS_TDMPC2,
    DQN,
    TDMPC2,
    Result,
    assert_autocast,
    assert_compiled,
    assert_compiled_once_each,
    assert_direct_steps_match,
    assert_fused,
    assert_matches,
    change_agreement,
    compile_run,
    dqn_data,
    metrics_rel_diff,
    relative_change_error,
    run,
    tdmpc2_data,
)
from helpers.fit import K

from callbacks import FusedOptimizer, MixedPrecision, TorchCompile


# ---------------------------------------------------------------------------------------------- DQN
@pytest.fixture(scope="module")
def dqn_reference() -> Result:
    return run(DQN, dqn_data, [])


def test_dqn_fused_optimizer_matches(dqn_reference: Result) -> None:
    fused = run(DQN, dqn_data, [FusedOptimizer()])
    assert_matches(dqn_reference, fused, exact_actions=True)
    assert_fused(dqn_reference, fused)


def test_dqn_direct_steps_match(dqn_reference: Result) -> None:
    assert_direct_steps_match(dqn_reference, DQN, dqn_data)


@pytest.mark.slow
def test_dqn_compile_matches(dqn_reference: Result) -> None:
    compiled = compile_run(DQN, dqn_data)
    assert_matches(dqn_reference, compiled, exact_actions=True)
    assert_compiled(dqn_reference, compiled)
    assert_compiled_once_each(compiled)


@pytest.mark.slow
def test_dqn_whole_update_compiled_matches(dqn_reference: Result) -> None:
    # regions=False: the whole update compiled, in pieces between its backward pass and optimizer step.
    whole = TorchCompile(mode="default", backend="aot_eager", paths=["update"], regions=False)
    compiled = run(DQN, dqn_data, [whole])
    assert_matches(dqn_reference, compiled, exact_actions=True)
    assert compiled.evidence.compiled_variants == {"update": 1, "td_loss": 0}


def test_dqn_bf16_close(dqn_reference: Result) -> None:
    ref, low = dqn_reference, run(DQN, dqn_data, [MixedPrecision("bf16")])
    assert_autocast(ref, low)
    assert metrics_rel_diff(ref, low, step=0, keys=["loss", "grad_norm"]) < BF16_FIRST_LOSS
    assert relative_change_error(ref, low) < BF16_REL
    same = torch.cat([a == b for a, b in zip(ref.actions, low.actions)]).float().mean().item()
    assert same >= BF16_ACTIONS


# ---------------------------------------------------------------------------------------------- TD-MPC2
@pytest.fixture(scope="module")
def tdmpc2_reference() -> Result:
    try:
        from rl_lightning.algos.tdmpc2 import TDMPC2 as _  # noqa: F401
    except ImportError as err:
        pytest.skip(f"TD-MPC2 module not importable: {err}")
    return run(TDMPC2, tdmpc2_data, [])


def test_tdmpc2_fused_optimizer_matches(tdmpc2_reference: Result) -> None:
    fused = run(TDMPC2, tdmpc2_data, [FusedOptimizer()])
    assert_matches(tdmpc2_reference, fused, exact_actions=False)
    assert_fused(tdmpc2_reference, fused)


def test_tdmpc2_direct_steps_match(tdmpc2_reference: Result) -> None:
    assert_direct_steps_match(tdmpc2_reference, TDMPC2, tdmpc2_data)


@pytest.mark.slow
def test_tdmpc2_compile_matches(tdmpc2_reference: Result) -> None:
    # Traced with aot_eager, as the families' updates: inductor's code generation for the world model's
    # update took 155 s of a CI run on a cold cache (25 s warm).
    compiled = compile_run(TDMPC2, tdmpc2_data, "aot_eager")
    assert_matches(tdmpc2_reference, compiled, exact_actions=False)
    assert_compiled(tdmpc2_reference, compiled)
    assert_compiled_once_each(compiled)


def test_tdmpc2_bf16_close(tdmpc2_reference: Result) -> None:
    ref, low = tdmpc2_reference, run(TDMPC2, tdmpc2_data, [MixedPrecision("bf16")])
    assert_autocast(ref, low)
    # The world-model losses; the policy's entropy terms sum bf16 log-probabilities (about 10% off).
    world_model = ["consistency_loss", "reward_loss", "value_loss", "total_loss", "grad_norm"]
    for step in range(K):  # every update starts from the bf16 run's own parameters
        assert metrics_rel_diff(ref, low, step=step, keys=world_model) < BF16_FIRST_LOSS
    cosine, signs = change_agreement(ref, low)
    assert cosine > BF16_COSINE_TDMPC2 and signs > BF16_SIGNS_TDMPC2, (cosine, signs)
    scale = ref.before["actions.scale"]
    for action in low.actions:
        assert ((action - ref.before["actions.bias"]).abs() <= scale + 1e-6).all()
    # MPPI keeps the top-k sampled sequences: rounding changes which win, so plans are compared loosely.
    gap = torch.stack([(a - b).abs().mean() for a, b in zip(ref.actions, low.actions)]).mean()
    assert gap / (2 * scale.max()) < BF16_PLAN_GAP


# ---------------------------------------------------------------------------------------------- resume
RESUME = (
    "fit",
    "+experiment=dqn_cartpole",
    "device=cpu",
    "logger=none",
    "progress_bar=false",
    "eval.episodes=1",
    "eval.every_frames=0",
    "collect.frames_per_batch=64",
    "collect.warmup_frames=128",
    "checkpoint.every_frames=128",
    "callbacks=[default,fused_optimizer,mixed_precision,compile]",
    "callbacks.compile.paths=[act]",  # compiling update too costs about 45 s per process on this CPU
    "callbacks.throughput.log_every_n_steps=8",
)


def callback_state(ckpt: dict, name: str) -> dict:
    (state,) = [v for k, v in ckpt["callbacks"].items() if k.startswith(name)]
    return state


@pytest.mark.slow
def test_callback_state_survives_resume_through_the_cli(tmp_path: Path) -> None:
    first = run_main(tmp_path, *RESUME, "total_frames=256")
    assert first.returncode == 0, first.stderr[-3000:]
    (last,) = tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")
    saved = torch.load(last, weights_only=True)
    compile_s = callback_state(saved, "TorchCompile")["compile_s"]
    updates = callback_state(saved, "ThroughputMonitor")["updates"]
    assert compile_s > 0 and updates > 0
    assert saved["optimizer_states"][0]["param_groups"][0]["fused"] is True

    second = run_main(tmp_path, *RESUME, "total_frames=384", "ckpt_path=last")
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resuming from" in second.stdout
    resumed = torch.load(last, weights_only=True)
    dm = next(v for k, v in resumed.items() if k.endswith("RLDataModule"))
    assert dm["frames"] == 384
    # The state came back and carried on: counters continue, compile time adds the resumed process's.
    assert callback_state(resumed, "ThroughputMonitor")["updates"] == dm["updates"] > updates
    assert callback_state(resumed, "TorchCompile")["compile_s"] > compile_s
    assert resumed["optimizer_states"][0]["param_groups"][0]["fused"] is True
    # The resumed optimizer continued the saved one: Adam's step count went on from where it stopped.
    steps = [s["step"] for s in resumed["optimizer_states"][0]["state"].values()]
    assert all(float(s) == dm["updates"] for s in steps)
