"""The harness of the callback equivalence tests (``tests/callbacks/test_callbacks_equivalence*.py``) and
the cases they share with ``tests/algos/test_clear_grads.py``.

- :func:`run`: the module built from an experiment's config with a fixed seed, trained by a real
  ``lightning.Trainer`` on ``K`` fixed batches with the given callbacks; a :class:`Recorder` calls ``act``
  on fixed observations after every update. It returns a :class:`Result`: the parameters before and after,
  the actions, every update's metrics, and the :class:`Evidence` that each optimization acted (positive
  controls: an equal result alone is also what an optimization that did nothing gives).
- Comparisons of two results: :func:`assert_matches` (float32 rounding, or bit for bit),
  :func:`assert_close_runs` (on a device), :func:`assert_direct_steps_match`, and the measures
  :func:`max_abs_diff`, :func:`relative_change_error`, :func:`change_agreement`, :func:`metrics_rel_diff`;
  the bounds they are held to (``EXACT_ATOL``, ``BF16_*``, :class:`Bf16Bounds`).
- :class:`FamilyEquivalence`: the CPU tests each family's file runs on each of its experiments.
- The cases: the configs and data of DQN (``DQN``, :func:`dqn_data`) and TD-MPC2 (``TDMPC2``,
  :func:`tdmpc2_data`), and of the families, each with the bf16 bounds measured on it:
  :func:`actor_critic_data` and ``ACTOR_CRITIC_BF16`` (SAC, discrete SAC, TD3, DDPG),
  :func:`quantile_data` and ``QUANTILE_BF16`` (C51, Rainbow, QR-DQN, IQN, AC-IQN), :func:`options_data`
  (SAC with options, held to the actor-critic bounds).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar

import lightning as L
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from callbacks import (
    CudaGraphs,
    DirectSteps,
    FusedOptimizer,
    MixedPrecision,
    NonBlockingTransfer,
    TorchCompile,
)
from callbacks._protocol import restore_hot_paths, wrap_hot_path
from callbacks.direct_steps import CountedStep
from helpers.batches import rollout_data, transition_data
from helpers.fit import FixedBatches, K
from rl_lightning.algos.options import OPTION_AGE_KEY, OPTION_KEY
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
class Evidence:
    """What a fit did besides its results, seen from outside the callbacks (the positive controls).

    Attributes:
        compiled_frames: frames dynamo compiled during the fit (``torch._dynamo.utils.counters``).
        dtypes: how many floating-point outputs of each dtype the module's submodules returned during the
            updates and ``act`` calls (forward hooks on every submodule: ``ReLUMLP`` calls its layers'
            functions directly, so the MLP's own output is what shows autocast); calls inside compiled code
            are not counted.
        fused: ``fused`` of every parameter group of every optimizer of the fit.
        compiled_variants: for ``update`` and each of its compile regions (``compile_regions``), the compiled
            variants dynamo kept (its cache entries): one for each function ``TorchCompile`` compiled, none
            for those it did not, more where a guard failed after the first call and the function was
            traced again.
    """

    compiled_frames: int = 0
    compiled_variants: dict[str, int] = field(default_factory=dict)
    dtypes: Counter = field(default_factory=Counter)
    fused: list[Any] = field(default_factory=list)


class EvidenceRecorder(L.Callback):
    """Collects :class:`Evidence` during a fit; listed first, so its hooks are in place before the others'
    ``on_fit_start`` wraps the hot paths."""

    def __init__(self) -> None:
        self.evidence = Evidence()
        self._frames_before = 0
        self._hooks: list[Any] = []

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Code an earlier fit in this process compiled (the same class's hot path) would be reused from
        # dynamo's cache without compiling a frame: every fit starts from an empty cache.
        torch._dynamo.reset()
        self._frames_before = torch._dynamo.utils.counters["frames"]["ok"]

        def seen(module: torch.nn.Module, args: Any, output: Any) -> None:
            # Left out of compiled code: traced, the count would be a guard that fails at every call, and
            # each update would compile again (measured: TD3's compile test took 52 s instead of 12).
            if torch.compiler.is_compiling():
                return
            if isinstance(output, torch.Tensor) and output.is_floating_point():
                self.evidence.dtypes[output.dtype] += 1

        self._hooks = [m.register_forward_hook(seen) for m in pl_module.modules() if m is not pl_module]

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for hook in self._hooks:
            hook.remove()
        self.evidence.compiled_frames = torch._dynamo.utils.counters["frames"]["ok"] - self._frames_before
        names = ("update", *pl_module.compile_regions.get("update", ()))
        self.evidence.compiled_variants = {
            name: len(torch._dynamo.eval_frame._debug_get_cache_entry_list(getattr(type(pl_module), name)))
            for name in names
        }
        self.evidence.fused = [g.get("fused") for opt in trainer.optimizers for g in opt.param_groups]


@dataclass
class Result:
    before: dict[str, torch.Tensor]  # parameters and buffers before the fit
    after: dict[str, torch.Tensor]  # ... and after it
    actions: list[torch.Tensor]  # act after each update
    metrics: list[TensorDictBase]  # what each update returned (losses, gradient norms)
    evidence: Evidence  # what the fit did besides its results


def assert_fused(ref: Result, other: Result) -> None:
    """``FusedOptimizer`` acted: every parameter group of ``other``'s optimizers is fused, none of ``ref``'s
    (the control without the callback)."""
    assert other.evidence.fused and all(f is True for f in other.evidence.fused), other.evidence.fused
    assert ref.evidence.fused and not any(ref.evidence.fused), ref.evidence.fused


def assert_compiled(ref: Result, other: Result) -> None:
    """``TorchCompile`` acted: dynamo compiled frames in ``other``'s fit and none in ``ref``'s."""
    assert other.evidence.compiled_frames > 0
    assert ref.evidence.compiled_frames == 0


def assert_compiled_once_each(result: Result) -> None:
    """``update`` was compiled as its compile regions, each traced once: none was traced again after a
    guard failed (TD3's critic-only and full updates share one variant of each loss)."""
    variants = dict(result.evidence.compiled_variants)
    assert variants.pop("update") == 0 and variants and set(variants.values()) == {1}, variants


def assert_autocast(ref: Result, other: Result, dtype: torch.dtype = torch.bfloat16) -> None:
    """``MixedPrecision`` acted: submodules returned ``dtype`` in ``other``'s fit and never in ``ref``'s."""
    assert other.evidence.dtypes[dtype] > 0, other.evidence.dtypes
    assert ref.evidence.dtypes[dtype] == 0 and ref.evidence.dtypes[torch.float32] > 0, ref.evidence.dtypes


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
    recorder, evidence = Recorder(observations), EvidenceRecorder()
    trainer = L.Trainer(
        accelerator="cpu" if device == "cpu" else "gpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[evidence, *callbacks, recorder],
    )
    torch.manual_seed(1)
    with torch._inductor.config.patch(fallback_random=True):
        trainer.fit(module, train_dataloaders=FixedBatches(batches))
    after = {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}
    assert len(recorder.actions) == len(recorder.metrics) == updates
    return Result(before, after, recorder.actions, recorder.metrics, evidence.evidence)


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


def assert_acted(callbacks: list, batches: int) -> None:
    """The GPU callbacks' positive controls, beside an equality test: ``CudaGraphs`` captured its paths and
    answered calls with graph replays; ``NonBlockingTransfer``'s hook moved every one of the fit's
    ``batches``."""
    for callback in callbacks:
        if isinstance(callback, CudaGraphs):
            assert callback.graphs_captured > 0 and callback.graph_replays > 0, callback.graph_replays
        if isinstance(callback, NonBlockingTransfer):
            assert callback.batches_moved == batches, callback.batches_moved


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


def compile_run(
    overrides: list[str], make_data: Callable, backend: str = "inductor", paths: list[str] | None = None
) -> Result:
    """The run with ``TorchCompile`` in its default mode, on ``backend``, over ``paths`` (``None``: every
    hot path)."""
    return run(overrides, make_data, [TorchCompile(mode="default", backend=backend, paths=paths)])


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

    - ``FusedOptimizer``, ``DirectSteps``, ``TorchCompile`` on ``act`` and (``slow``) on ``update``
      (``COMPILED``, traced with ``aot_eager``): float32 rounding only, ``DirectSteps`` bit for bit.
    - ``MixedPrecision`` (bf16): the first update's loss ``loss_key(name)`` within ``BF16_FIRST_LOSS``, and
      the family's ``BF16`` bounds on the parameter change and the actions.
    """

    EXPERIMENTS: ClassVar[dict[str, list[str]]]
    #: The experiments whose ``update`` ``test_compile_matches`` compiles (default: all); one that runs the
    #: same update code as another may be left to it, since compiling an update takes seconds.
    COMPILED: ClassVar[frozenset[str] | None] = None
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
            names = self.EXPERIMENTS
            if metafunc.function.__name__ == "test_compile_matches" and self.COMPILED is not None:
                names = self.COMPILED
            metafunc.parametrize("name", sorted(names))

    def reference(self, name: str) -> Result:
        """The run without callbacks, once per experiment and process."""
        key = (type(self), name)
        if key not in _REFERENCES:
            _REFERENCES[key] = run(self.EXPERIMENTS[name], self.make_data, [])
        return _REFERENCES[key]

    def test_fused_optimizer_matches(self, name: str) -> None:
        other = run(self.EXPERIMENTS[name], self.make_data, [FusedOptimizer()])
        assert_matches(self.reference(name), other, exact_actions=name in self.EXACT_ACTIONS)
        assert_fused(self.reference(name), other)

    def test_direct_steps_match(self, name: str) -> None:
        assert_direct_steps_match(self.reference(name), self.EXPERIMENTS[name], self.make_data)

    def test_compiled_act_matches(self, name: str) -> None:
        # aot_eager, as test_compile_matches: inductor's first code generation in a process costs tens of
        # seconds on a cold cache, and this test is in the fast tier.
        act = TorchCompile(mode="default", paths=["act"], backend="aot_eager")
        other = run(self.EXPERIMENTS[name], self.make_data, [act])
        assert_matches(self.reference(name), other, exact_actions=name in self.EXACT_ACTIONS)
        assert_compiled(self.reference(name), other)

    @pytest.mark.slow
    def test_compile_matches(self, name: str) -> None:
        # Traced with aot_eager: dynamo's capture and AOTAutograd's forward and backward graphs, where
        # compiling can change an update's results, run on eager kernels. Inductor's code generation costs
        # tens of seconds per update on a cold cache (TD3's test: 66 s with inductor, 28 s without); DQN's
        # test (test_callbacks_equivalence.py) is the one that generates code. ``act`` compiled is
        # test_compiled_act_matches's.
        other = compile_run(self.EXPERIMENTS[name], self.make_data, "aot_eager", paths=["update"])
        assert_matches(self.reference(name), other, exact_actions=name in self.EXACT_ACTIONS)
        assert_compiled(self.reference(name), other)
        assert_compiled_once_each(other)

    def test_bf16_close(self, name: str) -> None:
        ref, low = self.reference(name), run(self.EXPERIMENTS[name], self.make_data, [MixedPrecision("bf16")])
        assert_autocast(ref, low)
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


# ------------------------------------------------------------------------------------------ TD-MPC2
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


# ------------------------------------------------------------------------------------- actor-critic
# Measured here (CPU, torch 2.13), bf16 against float32: the first update's critic loss within 0.35% (SAC),
# 0.05% (discrete SAC) and 1e-5 (TD3, DDPG) of float32's; the parameter change of 4 Adam steps has a
# cosine of 0.996 to 0.998 with float32's and 99.6 to 99.97% of its larger-than-median entries keep their
# sign; continuous actions move by less than 0.06% of the action range, 98% of discrete ones are equal.
# The bounds allow about 5x to 20x that.
ACTOR_CRITIC_BF16 = Bf16Bounds(cosine=0.95, signs=0.97, actions=0.9, action_gap=0.01)

actor_critic_data = partial(transition_data, seed=7)


# ----------------------------------------------------------------------------------------- quantile
# Measured here (CPU, torch 2.13), bf16 against float32 after K = 4 updates: the first update's loss within
# 0.01-0.07%; the parameter change has a cosine of 0.98-1.0 with float32's and over 99.5% of its
# larger-than-median entries keep their sign; 88% (C51: its Q-values are expectations over a 0-100 support of
# nearly uniform probabilities after 4 updates, so greedy actions flip on near-ties) to 100% of the discrete
# actions are equal. The bounds allow about 2x to 5x the differences.
QUANTILE_BF16 = Bf16Bounds(cosine=0.9, signs=0.95, actions=0.75, action_gap=0.1)  # action_gap: AC-IQN

quantile_data = partial(transition_data, seed=11, reward=torch.rand)


# ------------------------------------------------------------------------------------------ options
def options_data(module: torch.nn.Module, k: int = K) -> tuple[list, list]:
    """The actor-critic batches with the acting option; a quarter of the rows are warm-up rows (age 0)."""
    batches, observations = actor_critic_data(module, k=k)
    g = torch.Generator().manual_seed(11)
    for b in batches:
        n = b.batch_size[0]
        b[OPTION_KEY] = torch.randint(0, module.num_options, (n,), generator=g)
        b[OPTION_AGE_KEY] = torch.randint(1, 20, (n,), generator=g) * (torch.rand(n, generator=g) > 0.25)
    return batches, observations


# ----------------------------------------------------------------------------------------------- PPO
ppo_data = partial(rollout_data, seed=5)


#: Every algorithm at a small size, with the batches its update takes: ``{name: (overrides, make_data)}``.
#: No ``algo.grad_clip`` here: the tests that use it set their own.
ALGORITHMS: dict[str, tuple[list[str], Callable[..., tuple[list, list]]]] = {
    "dqn": (DQN, dqn_data),
    "c51": (["+experiment=c51_cartpole", "algo.hidden_sizes=[32,32]"], quantile_data),
    "rainbow": (["+experiment=rainbow_cartpole", "algo.hidden_sizes=[32,32]"], quantile_data),
    "qrdqn": (["+experiment=qrdqn_cartpole", "algo.hidden_sizes=[32,32]"], quantile_data),
    "iqn": (["+experiment=iqn_cartpole", "algo.hidden_sizes=[32,32]"], quantile_data),
    "aciqn": (
        [
            "+experiment=aciqn_pendulum",
            "algo.actor_hidden_sizes=[32,32]",
            "algo.critic_hidden_sizes=[32,32]",
            "algo.policy_delay=1",
        ],
        quantile_data,
    ),
    "sac": (["+experiment=sac_pendulum", "algo.hidden_sizes=[32,32]"], actor_critic_data),
    "sac_discrete": (["+experiment=sac_discrete_cartpole", "algo.hidden_sizes=[32,32]"], actor_critic_data),
    "td3": (
        ["+experiment=td3_pendulum", "algo.hidden_sizes=[32,32]", "algo.policy_delay=1"],
        actor_critic_data,
    ),
    "ddpg": (["+experiment=ddpg_pendulum", "algo.hidden_sizes=[32,32]"], actor_critic_data),
    "sac_options": (["+experiment=sac_options_pendulum", "algo.hidden_sizes=[32,32]"], options_data),
    "tdmpc2": (TDMPC2, tdmpc2_data),
    "ppo": (["+experiment=ppo_cartpole", "algo.hidden_sizes=[32,32]"], ppo_data),
    "ppo_continuous": (["algo=ppo", "env=pendulum", "algo.hidden_sizes=[32,32]"], ppo_data),
}
