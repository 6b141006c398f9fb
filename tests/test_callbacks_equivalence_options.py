"""Optimization callbacks change speed, not results: SAC with options with and without each of them.

The harness of ``tests/test_callbacks_equivalence.py``: the module built from its experiment's config with
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

import lightning as L
import pytest
import torch
from test_callbacks_equivalence import (
    ACT_N,
    BF16_FIRST_LOSS,
    FixedBatches,
    K,
    Recorder,
    Result,
    assert_direct_steps_match,
    assert_matches,
    change_agreement,
    compile_run,
    metrics_rel_diff,
    run,
)
from test_callbacks_equivalence_actor_critic import BF16_ACTION_GAP, BF16_ACTIONS, BF16_COSINE, BF16_SIGNS
from test_callbacks_equivalence_actor_critic import make_data as actor_critic_data

from callbacks import (
    CudaGraphs,
    FusedOptimizer,
    MixedPrecision,
    NonBlockingTransfer,
    TorchCompile,
)
from rl_lightning.algos.options import OPTION_AGE_KEY, OPTION_KEY
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config

SMALL = ["device=cpu", "algo.hidden_sizes=[32,32]", f"algo.num_envs={ACT_N}", "algo.usage_window=256"]
EXPERIMENTS = {
    "continuous": ["+experiment=sac_options_pendulum", *SMALL],
    "discrete": ["+experiment=sac_options_pendulum", "env=cartpole", *SMALL],
}


def make_data(module: torch.nn.Module, k: int = K) -> tuple[list, list]:
    """The actor-critic batches with the acting option; a quarter of the rows are warm-up rows (age 0)."""
    batches, observations = actor_critic_data(module, k=k)
    g = torch.Generator().manual_seed(11)
    for b in batches:
        n = b.batch_size[0]
        b[OPTION_KEY] = torch.randint(0, module.num_options, (n,), generator=g)
        b[OPTION_AGE_KEY] = torch.randint(1, 20, (n,), generator=g) * (torch.rand(n, generator=g) > 0.25)
    return batches, observations


def exact_actions(name: str) -> bool:
    return name == "discrete"


_REFERENCES: dict[str, Result] = {}


def reference(name: str) -> Result:
    if name not in _REFERENCES:
        _REFERENCES[name] = run(EXPERIMENTS[name], make_data, [])
    return _REFERENCES[name]


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_reference_exercises_every_loss_and_option_metric(name: str) -> None:
    ref = reference(name)
    for metrics in ref.metrics:
        assert metrics["loss_termination"] != 0 and torch.isfinite(metrics["loss_qvalue"])
    # act runs after each update: from the second update on the usage window holds its steps.
    assert all(m["options/duration_mean"] >= 1 for m in ref.metrics[1:])
    changed = [k for k, v in ref.before.items() if v.is_floating_point() and not torch.equal(v, ref.after[k])]
    assert any(k.startswith("termination_net") for k in changed)
    assert any(k.startswith("target_critic") for k in changed)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_fused_optimizer_matches(name: str) -> None:
    other = run(EXPERIMENTS[name], make_data, [FusedOptimizer()])
    assert_matches(reference(name), other, exact_actions=exact_actions(name))


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_direct_steps_match(name: str) -> None:
    assert_direct_steps_match(reference(name), EXPERIMENTS[name], make_data)


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_compiled_act_matches(name: str) -> None:
    other = run(EXPERIMENTS[name], make_data, [TorchCompile(mode="default", paths=["act"])])
    assert_matches(reference(name), other, exact_actions=exact_actions(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_compile_matches(name: str) -> None:
    assert_matches(reference(name), compile_run(EXPERIMENTS[name], make_data), exact_actions(name))


@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_bf16_close(name: str) -> None:
    ref, low = reference(name), run(EXPERIMENTS[name], make_data, [MixedPrecision("bf16")])
    assert metrics_rel_diff(ref, low, step=0, keys=["loss_qvalue"]) < BF16_FIRST_LOSS
    cosine, signs = change_agreement(ref, low)
    assert cosine > BF16_COSINE and signs > BF16_SIGNS, (cosine, signs)
    if exact_actions(name):
        same = torch.cat([a == b for a, b in zip(ref.actions, low.actions)]).float().mean().item()
        assert same >= BF16_ACTIONS
    else:
        scale = ref.before["actions.scale"]
        gap = torch.stack([(a - b).abs().mean() for a, b in zip(ref.actions, low.actions)]).mean()
        assert gap / (2 * scale.max()) < BF16_ACTION_GAP


# ------------------------------------------------------------------------------------------------ GPU
GPU_K = 8


class _DeviceRecorder(Recorder):
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        td = self.observations[len(self.actions)].to(pl_module.device)
        with torch.no_grad():
            self.actions.append(pl_module.act(td).get("action").clone().cpu())


def run_gpu(overrides: list[str], callbacks: list) -> Result:
    """The seeded fit of ``run`` on CUDA, for ``GPU_K`` updates."""
    cfg = compose([*overrides, "device=cuda"])
    torch.manual_seed(0)
    module = build_module(cfg, env_config(cfg))
    batches, observations = make_data(module, k=GPU_K)
    before = {k: v.detach().clone() for k, v in module.state_dict().items()}
    recorder = _DeviceRecorder(observations)
    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[*callbacks, recorder],
    )  # fmt: skip
    torch.manual_seed(1)
    with torch._inductor.config.patch(fallback_random=True):
        trainer.fit(module, train_dataloaders=FixedBatches(batches))
    after = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    return Result({k: v.cpu() for k, v in before.items()}, after, recorder.actions, recorder.metrics)


@pytest.mark.gpu
@pytest.mark.parametrize("callbacks", ["cuda_graphs", "non_blocking"])
@pytest.mark.parametrize("name", sorted(EXPERIMENTS))
def test_gpu_callbacks_match_eager(name: str, callbacks: str) -> None:
    make = {
        "cuda_graphs": lambda: [TorchCompile(mode="default"), CudaGraphs(warmup=3)],
        "non_blocking": lambda: [NonBlockingTransfer()],
    }[callbacks]
    ref, other = run_gpu(EXPERIMENTS[name], []), run_gpu(EXPERIMENTS[name], make())
    assert len(other.metrics) == GPU_K
    for key, value in ref.after.items():
        if value.is_floating_point():
            torch.testing.assert_close(other.after[key], value, atol=1e-4, rtol=1e-3)
    for a, b in zip(ref.metrics, other.metrics):
        for key in a.keys():
            torch.testing.assert_close(b[key].cpu(), a[key].cpu(), atol=1e-4, rtol=1e-3)
    for a, b in zip(ref.actions, other.actions):
        torch.testing.assert_close(b.float(), a.float(), atol=1e-4, rtol=1e-3)
