"""Optimization callbacks change speed, not results: the real algorithms with and without each of them.

Each module is built from its experiment's config with a fixed seed and trained by a real
``lightning.Trainer`` on a fixed sequence of ``K`` batches; after every update a recorder calls ``act`` on
fixed observations (the wrapped ``act`` is in place during the fit, as during collection). The parameters
after the fit, the metrics of every update and every action must match the run without callbacks:

- ``FusedOptimizer``: one fused Adam kernel instead of the for-loop one; rounding only.
- ``DirectSteps``: the same optimizer steps without Lightning's hook dispatch; identical results.
- ``TorchCompile`` (mode ``default``): inductor reorders and fuses float32 ops. Inductor also draws random
  numbers its own way, so the test sets ``torch._inductor.config.fallback_random`` to draw them with
  eager's generator: with it, exploring actions and TD-MPC2's plans use the same samples.
- ``MixedPrecision`` (bf16): 8 mantissa bits in matmuls; a looser test on the parameter *changes*
  (relative error) and on the share of equal actions.

The families of ``test_callbacks_equivalence_{actor_critic,quantile,options}.py`` run the first four of
these through ``FamilyEquivalence`` (a ``Test...`` class per family, one case per experiment), and their
GPU tests through ``run(..., device="cuda")``.

The end of the file runs ``fit`` through the real CLI with the CPU-acting callbacks and resumes it with
``ckpt_path=last``: the callbacks' state (compile time, throughput counters) and the fused optimizer state
come back and carry on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import ClassVar

import lightning as L
import pytest
import torch
from cli_helpers import run_cli
from fit_helpers import FixedBatches, K, transition_data
from tensordict import TensorDict, TensorDictBase

from callbacks import DirectSteps, FusedOptimizer, MixedPrecision, TorchCompile
from callbacks._protocol import restore_hot_paths, wrap_hot_path
from callbacks.direct_steps import CountedStep
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config

# Measured here (CPU, torch 2.13): fused Adam vs for-loop Adam after 4 steps: max |diff| 3e-8 (DQN) and
# 5e-8 (TD-MPC2), actions identical; compile vs eager (DQN): below 1e-6. The bound leaves room for other
# CPUs' kernels.
EXACT_ATOL = 1e-5
# bf16, measured: the first update's losses within 0.08% (DQN) and 0.2% (TD-MPC2's world model) of float32's,
# TD-MPC2's world-model losses within 0.3% at every one of the 4 updates; the parameter change of 4 Adam
# steps within 5% relative (DQN). TD-MPC2's change is 31% off in norm (Adam turns small, sign-flipped
# gradients into full steps) but points the same way: cosine 0.957, and 99.3% of the changes larger than
# the median have float32's sign. 99% of DQN's actions equal (greedy ones flip on near-ties); TD-MPC2's plans
# differ by 10% of the action range on average. The bounds allow about 2x to 20x that.
BF16_FIRST_LOSS = 0.02
BF16_REL = 0.15
BF16_COSINE_TDMPC2 = 0.9
BF16_SIGNS_TDMPC2 = 0.97
BF16_ACTIONS = 0.9
BF16_PLAN_GAP = 0.25


class Recorder(L.Callback):
    """Records what ``update`` returns and, after every update, calls ``act`` on fixed observations (moved
    to the module's device; the actions are kept on the CPU).

    Listed last, it wraps ``update`` outermost, around the other callbacks' wrappers.
    """

    def __init__(self, observations: list[TensorDictBase]) -> None:
        self.observations = observations
        self.actions: list[torch.Tensor] = []
        self.metrics: list[TensorDictBase] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def record(update: Callable) -> Callable:
            def run(batch: TensorDictBase) -> TensorDictBase:
                out = update(batch)
                self.metrics.append(out.clone())
                return out

            return run

        wrap_hot_path(pl_module, "update", record, owner=self)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        td = self.observations[len(self.actions)].clone().to(pl_module.device)
        with torch.no_grad():
            self.actions.append(pl_module.act(td).get("action").clone().cpu())

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        restore_hot_paths(pl_module, self)


@dataclass
class Result:
    before: dict[str, torch.Tensor]  # parameters and buffers before the fit
    after: dict[str, torch.Tensor]  # ... and after it
    actions: list[torch.Tensor]  # act after each update
    metrics: list[TensorDictBase]  # what each update returned (losses, gradient norms)


def run(
    overrides: list[str],
    make_data: Callable[..., tuple[list, list]],
    callbacks: list,
    device: str = "cpu",
    updates: int = K,
) -> Result:
    """A seeded fit of the experiment's module on ``updates`` fixed batches with ``callbacks``, on
    ``device`` (``cpu`` or ``cuda``); the parameters before and after it are kept on the CPU."""
    cfg = compose([*overrides, f"device={device}"])
    torch.manual_seed(0)
    module = build_module(cfg, env_config(cfg))
    batches, observations = make_data(module, k=updates)
    before = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    recorder = Recorder(observations)
    trainer = L.Trainer(
        accelerator="cpu" if device == "cpu" else "gpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[*callbacks, recorder],
    )
    torch.manual_seed(1)
    with torch._inductor.config.patch(fallback_random=True):
        trainer.fit(module, train_dataloaders=FixedBatches(batches))
    after = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    assert len(recorder.actions) == len(recorder.metrics) == updates
    return Result(before, after, recorder.actions, recorder.metrics)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point())


def relative_change_error(ref: Result, other: Result) -> float:
    """``|Δother - Δref| / |Δref|`` over the floating parameters and buffers that training moved."""
    keys = [k for k, v in ref.before.items() if v.is_floating_point() and not torch.equal(v, ref.after[k])]
    delta_ref = torch.cat([(ref.after[k] - ref.before[k]).double().flatten() for k in keys])
    delta = torch.cat([(other.after[k] - other.before[k]).double().flatten() for k in keys])
    return ((delta - delta_ref).norm() / delta_ref.norm()).item()


def change_agreement(ref: Result, other: Result) -> tuple[float, float]:
    """Cosine between the parameter changes of two runs, and the share of ``ref``'s larger-than-median
    changes that ``other`` made with the same sign."""
    keys = [k for k, v in ref.before.items() if v.is_floating_point() and not torch.equal(v, ref.after[k])]
    delta_ref = torch.cat([(ref.after[k] - ref.before[k]).double().flatten() for k in keys])
    delta = torch.cat([(other.after[k] - other.before[k]).double().flatten() for k in keys])
    cosine = torch.nn.functional.cosine_similarity(delta_ref, delta, dim=0).item()
    big = delta_ref.abs() > delta_ref.abs().median()
    signs = (delta_ref.sign() == delta.sign())[big].double().mean().item()
    return cosine, signs


def metrics_rel_diff(ref: Result, other: Result, step: int, keys: list[str]) -> float:
    """Largest relative difference between the metrics ``keys`` of update ``step``."""
    a, b = ref.metrics[step], other.metrics[step]
    return max(((a[k] - b[k]).abs() / a[k].abs().clamp_min(1e-6)).max().item() for k in keys)


def assert_matches(ref: Result, other: Result, exact_actions: bool, atol: float = EXACT_ATOL) -> None:
    """Float32 rounding only: parameters, metrics and actions agree to ``atol`` (``0``: bit for bit)."""
    assert max_abs_diff(ref.after, other.after) <= atol
    rtol = 1e-4 if atol else 0.0
    for a, b in zip(ref.metrics, other.metrics):
        assert all(torch.allclose(a[k], b[k], atol=atol, rtol=rtol) for k in a.keys()), (a, b)
    for a, b in zip(ref.actions, other.actions):
        assert torch.equal(a, b) if exact_actions else torch.allclose(a, b, atol=atol)


def assert_close_runs(ref: Result, other: Result, atol: float) -> None:
    """Runs on a device agree to ``atol`` (relative 1e-3): parameters after the updates, every update's
    metrics and every ``act``'s actions."""
    for key, value in ref.after.items():
        if value.is_floating_point():
            torch.testing.assert_close(other.after[key], value, atol=atol, rtol=1e-3)
    for a, b in zip(ref.metrics, other.metrics):
        for key in a.keys():
            torch.testing.assert_close(b[key].cpu(), a[key].cpu(), atol=atol, rtol=1e-3)
    for a, b in zip(ref.actions, other.actions):
        torch.testing.assert_close(b.float(), a.float(), atol=atol, rtol=1e-3)


def assert_direct_steps_match(ref: Result, overrides: list[str], make_data: Callable) -> None:
    """``DirectSteps`` took the steps over and the run equals the reference bit for bit; with fused
    optimizers too, whose steps after the first call the fused Adam kernel directly (``CountedStep``)."""
    callback = DirectSteps()
    assert_matches(ref, run(overrides, make_data, [callback]), exact_actions=True, atol=0.0)
    assert callback.direct_fits == 1
    fused_ref = run(overrides, make_data, [FusedOptimizer()])
    direct, taken, kernel_step = DirectSteps(), [], CountedStep._fused_adam_step

    def counted_kernel_step(self: CountedStep) -> bool:
        taken.append(kernel_step(self))
        return taken[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CountedStep, "_fused_adam_step", counted_kernel_step)
        fused_direct = run(overrides, make_data, [FusedOptimizer(), direct])
    assert_matches(fused_ref, fused_direct, exact_actions=True, atol=0.0)
    assert direct.direct_fits == 1 and any(taken)


def compile_run(overrides: list[str], make_data: Callable) -> Result:
    """The run with ``TorchCompile`` in its default mode."""
    return run(overrides, make_data, [TorchCompile(mode="default")])


@dataclass(frozen=True)
class Bf16Bounds:
    """A family's bounds on a bf16 run against float32 (besides ``BF16_FIRST_LOSS``)."""

    cosine: float  # the parameter changes' cosine is above it
    signs: float  # the share of larger-than-median changes with float32's sign is above it
    actions: float  # the share of equal actions (discrete) is at least it
    action_gap: float  # the mean |action difference| as a share of the action range is below it (continuous)


_REFERENCES: dict[tuple[type, str], Result] = {}


class FamilyEquivalence:
    """The CPU tests that each family's file runs on each of its experiments: a family subclasses this as
    ``Test<Family>Callbacks`` with its ``EXPERIMENTS``, ``make_data`` and bf16 bounds, and every test here
    takes ``name``, one of the experiments.

    - ``FusedOptimizer``, ``DirectSteps``, ``TorchCompile`` on ``act`` and (``slow``) on every hot path:
      float32 rounding only, ``DirectSteps`` bit for bit.
    - ``MixedPrecision`` (bf16): the first update's loss ``loss_key(name)`` within ``BF16_FIRST_LOSS``, and
      the family's ``BF16`` bounds on the parameter change and the actions.
    """

    EXPERIMENTS: ClassVar[dict[str, list[str]]]
    EXACT_ACTIONS: ClassVar[frozenset[str]]  # the experiments whose actions compare bit for bit (discrete)
    BF16: ClassVar[Bf16Bounds]

    @staticmethod
    def make_data(module: torch.nn.Module, k: int = K) -> tuple[list, list]:
        raise NotImplementedError

    def loss_key(self, name: str) -> str:
        """The loss whose first-update value bf16 must keep."""
        return "loss_qvalue"

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "name" in metafunc.fixturenames:
            metafunc.parametrize("name", sorted(self.EXPERIMENTS))

    def reference(self, name: str) -> Result:
        """The run without callbacks, once per experiment and process."""
        key = (type(self), name)
        if key not in _REFERENCES:
            _REFERENCES[key] = run(self.EXPERIMENTS[name], self.make_data, [])
        return _REFERENCES[key]

    def test_fused_optimizer_matches(self, name: str) -> None:
        other = run(self.EXPERIMENTS[name], self.make_data, [FusedOptimizer()])
        assert_matches(self.reference(name), other, exact_actions=name in self.EXACT_ACTIONS)

    def test_direct_steps_match(self, name: str) -> None:
        assert_direct_steps_match(self.reference(name), self.EXPERIMENTS[name], self.make_data)

    def test_compiled_act_matches(self, name: str) -> None:
        other = run(self.EXPERIMENTS[name], self.make_data, [TorchCompile(mode="default", paths=["act"])])
        assert_matches(self.reference(name), other, exact_actions=name in self.EXACT_ACTIONS)

    @pytest.mark.slow
    def test_compile_matches(self, name: str) -> None:
        other = compile_run(self.EXPERIMENTS[name], self.make_data)
        assert_matches(self.reference(name), other, exact_actions=name in self.EXACT_ACTIONS)

    def test_bf16_close(self, name: str) -> None:
        ref, low = self.reference(name), run(self.EXPERIMENTS[name], self.make_data, [MixedPrecision("bf16")])
        assert metrics_rel_diff(ref, low, step=0, keys=[self.loss_key(name)]) < BF16_FIRST_LOSS
        cosine, signs = change_agreement(ref, low)
        assert cosine > self.BF16.cosine and signs > self.BF16.signs, (cosine, signs)
        if name in self.EXACT_ACTIONS:
            same = torch.cat([a == b for a, b in zip(ref.actions, low.actions)]).float().mean().item()
            assert same >= self.BF16.actions
        else:
            scale = ref.before["actions.scale"]
            gap = torch.stack([(a - b).abs().mean() for a, b in zip(ref.actions, low.actions)]).mean()
            assert gap / (2 * scale.max()) < self.BF16.action_gap


# ---------------------------------------------------------------------------------------------- DQN
DQN = [
    "+experiment=dqn_cartpole",
    "device=cpu",
    "algo.eps_start=0.3",  # a fixed exploration rate: random and greedy actions both exercised
    "algo.eps_end=0.3",
    "algo.hard_update_every=2",  # a target copy inside the K updates
]


def _unit_rewards(*size: int, generator: torch.Generator) -> torch.Tensor:
    return torch.ones(*size)


dqn_data = partial(transition_data, seed=123, reward=_unit_rewards)


@pytest.fixture(scope="module")
def dqn_reference() -> Result:
    return run(DQN, dqn_data, [])


def test_dqn_fused_optimizer_matches(dqn_reference: Result) -> None:
    assert_matches(dqn_reference, run(DQN, dqn_data, [FusedOptimizer()]), exact_actions=True)


def test_dqn_direct_steps_match(dqn_reference: Result) -> None:
    assert_direct_steps_match(dqn_reference, DQN, dqn_data)


def test_dqn_compile_matches(dqn_reference: Result) -> None:
    assert_matches(dqn_reference, compile_run(DQN, dqn_data), exact_actions=True)


def test_dqn_bf16_close(dqn_reference: Result) -> None:
    ref, low = dqn_reference, run(DQN, dqn_data, [MixedPrecision("bf16")])
    assert metrics_rel_diff(ref, low, step=0, keys=["loss", "grad_norm"]) < BF16_FIRST_LOSS
    assert relative_change_error(ref, low) < BF16_REL
    same = torch.cat([a == b for a, b in zip(ref.actions, low.actions)]).float().mean().item()
    assert same >= BF16_ACTIONS


# ---------------------------------------------------------------------------------------------- TD-MPC2
TDMPC2 = [
    "+experiment=tdmpc2_pendulum",
    "device=cpu",
    "algo.latent_dim=32",
    "algo.mlp_dim=64",
    "algo.enc_dim=64",
    "algo.num_samples=32",
    "algo.num_elites=4",
    "algo.num_pi_trajs=4",
    "algo.iterations=2",
]


def tdmpc2_data(module: torch.nn.Module, k: int = K) -> tuple[list, list]:
    g = torch.Generator().manual_seed(321)
    h, n_slices = module.horizon, 8
    obs_dim, act_dim = int(module.obs_shape[0]), module.action_dim
    low, high = module.actions.bias - module.actions.scale, module.actions.bias + module.actions.scale

    def batch() -> TensorDict:
        obs = torch.randn(n_slices, h + 1, obs_dim, generator=g)
        td = TensorDict(
            {
                "observation": obs[:, :-1],
                "action": low + (high - low) * torch.rand(n_slices, h, act_dim, generator=g),
                "next": {
                    "observation": obs[:, 1:],
                    "reward": torch.randn(n_slices, h, 1, generator=g),
                    "terminated": torch.zeros(n_slices, h, 1, dtype=torch.bool),
                },
            },
            batch_size=[n_slices, h],
        )
        return td.reshape(-1)

    n = module.planner.num_envs
    obs = [
        TensorDict(
            {"observation": torch.randn(n, obs_dim, generator=g), "step_count": torch.full((n, 1), i)}, [n]
        )
        for i in range(k)
    ]
    return [batch() for _ in range(k)], obs


@pytest.fixture(scope="module")
def tdmpc2_reference() -> Result:
    try:
        from rl_lightning.algos.tdmpc2 import TDMPC2 as _  # noqa: F401
    except ImportError as err:
        pytest.skip(f"TD-MPC2 module not importable: {err}")
    return run(TDMPC2, tdmpc2_data, [])


def test_tdmpc2_fused_optimizer_matches(tdmpc2_reference: Result) -> None:
    assert_matches(tdmpc2_reference, run(TDMPC2, tdmpc2_data, [FusedOptimizer()]), exact_actions=False)


def test_tdmpc2_direct_steps_match(tdmpc2_reference: Result) -> None:
    assert_direct_steps_match(tdmpc2_reference, TDMPC2, tdmpc2_data)


def test_tdmpc2_compile_matches(tdmpc2_reference: Result) -> None:
    assert_matches(tdmpc2_reference, compile_run(TDMPC2, tdmpc2_data), exact_actions=False)


def test_tdmpc2_bf16_close(tdmpc2_reference: Result) -> None:
    ref, low = tdmpc2_reference, run(TDMPC2, tdmpc2_data, [MixedPrecision("bf16")])
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
    first = run_cli(tmp_path, *RESUME, "total_frames=256")
    assert first.returncode == 0, first.stderr[-3000:]
    (last,) = tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")
    saved = torch.load(last, weights_only=True)
    compile_s = callback_state(saved, "TorchCompile")["compile_s"]
    updates = callback_state(saved, "ThroughputMonitor")["updates"]
    assert compile_s > 0 and updates > 0
    assert saved["optimizer_states"][0]["param_groups"][0]["fused"] is True

    second = run_cli(tmp_path, *RESUME, "total_frames=384", "ckpt_path=last")
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
