"""TorchCompile, CudaGraphs, MixedPrecision and the hot-path wrapping they share."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers.toy import (
    MemoryLogger,
    ToyProtocolModule,
    WithCompileRegions,
    WithoutHotPaths,
    WithUnknownRegion,
    assert_state_close,
    baseline_state,
    fit_toy,
    max_abs_diff,
)
from tensordict import TensorDict

from callbacks import (
    TF32,
    CudaCacheClearing,
    CudaGraphs,
    FusedOptimizer,
    GPUMonitor,
    MixedPrecision,
    NonBlockingTransfer,
    ThroughputMonitor,
    TorchCompile,
)
from callbacks._protocol import restore_hot_paths, wrap_hot_path, wrapped_paths

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Compiled float32 ops may be reordered; after 12 Adam steps (lr 1e-2) inductor's parameters differed from
# eager's by about 1e-6 (AOTAutograd's graphs on eager kernels, as traced here, by less).
COMPILE_ATOL = 1e-5
# bf16 autocast keeps 8 mantissa bits in matmuls; measured max difference after 12 steps: 7.5e-4.
BF16_ATOL = 5e-3


def assert_restored(module: ToyProtocolModule) -> None:
    for name in module.hot_paths:
        assert name not in module.__dict__, f"{name} still shadowed after fit"
    assert wrapped_paths(module) == {}


# --- shared wrapping -------------------------------------------------------------------------------------


@pytest.mark.parametrize("restore_order", [("inner", "outer"), ("outer", "inner")])
def test_stacked_wrappers_restore_in_any_order(restore_order: tuple[str, str]) -> None:
    module = ToyProtocolModule()
    owners = {"inner": object(), "outer": object()}
    calls: list[str] = []

    def tag(label: str):
        def make(fn):
            def run(td):
                calls.append(label)
                return fn(td)

            return run

        return make

    wrap_hot_path(module, "act", tag("inner"), owners["inner"])
    wrap_hot_path(module, "act", tag("outer"), owners["outer"])
    assert wrapped_paths(module) == {"act": 2}
    module.act(TensorDict(observation=torch.zeros(2, 6), batch_size=[2]))
    assert calls == ["outer", "inner"]
    for label in restore_order:
        restore_hot_paths(module, owners[label])
    assert "act" not in module.__dict__
    assert module.act.__func__ is ToyProtocolModule.act


def test_missing_hot_paths_is_refused() -> None:
    with pytest.raises(TypeError, match="hot_paths = \\('update', 'act'\\)"):
        fit_toy([TorchCompile()], module_cls=WithoutHotPaths)


def test_unknown_path_is_refused() -> None:
    with pytest.raises(ValueError, match="not hot paths of ToyProtocolModule"):
        fit_toy([MixedPrecision("bf16", paths=["plan"])])


@pytest.mark.parametrize("cls", [TorchCompile, CudaGraphs, MixedPrecision])
def test_paths_argument_must_be_a_list(cls: type) -> None:
    with pytest.raises(ValueError, match="non-empty list of method names"):
        cls(paths="update")


# --- TorchCompile ----------------------------------------------------------------------------------------


def test_compile_rejects_bad_mode() -> None:
    with pytest.raises(ValueError, match=r"use one of .*'reduce-overhead'"):
        TorchCompile(mode="fast")


def test_compile_rejects_bad_flags() -> None:
    with pytest.raises(ValueError, match="fullgraph"):
        TorchCompile(fullgraph="yes")
    with pytest.raises(ValueError, match="dynamic"):
        TorchCompile(dynamic="auto")
    with pytest.raises(ValueError, match=r"backend='xla2' is not a dynamo backend; use one of .*'aot_eager'"):
        TorchCompile(backend="xla2")
    with pytest.raises(ValueError, match="mode='reduce-overhead' is inductor's; use mode=default"):
        TorchCompile(mode="reduce-overhead", backend="aot_eager")


def test_compile_passes_its_backend_and_mode_to_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict = {}
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: seen.update(kwargs) or fn)
    TorchCompile(backend="aot_eager")._compile(lambda x: x)
    assert seen["backend"] == "aot_eager" and seen["mode"] == "default"


@pytest.fixture(scope="module")
def compiled_fit():
    # Traced by dynamo and AOTAutograd, run on eager kernels: inductor's first code generation in a process
    # took 49 s of a CI run on a cold cache. DQN's compile test generates code with inductor.
    callback = TorchCompile(mode="default", backend="aot_eager")
    logger = MemoryLogger()
    torch._dynamo.reset()  # nothing cached from an earlier test: the fit compiles its own frames
    before = torch._dynamo.utils.counters["frames"]["ok"]
    module, _, _ = fit_toy([callback], logger=logger)
    callback.frames_compiled = torch._dynamo.utils.counters["frames"]["ok"] - before
    return callback, module, logger


def test_compile_matches_eager_on_cpu(compiled_fit) -> None:
    _, module, _ = compiled_fit
    assert_state_close(module, baseline_state(), atol=COMPILE_ATOL)


def test_compile_restores_hot_paths(compiled_fit) -> None:
    _, module, _ = compiled_fit
    assert_restored(module)


def test_compile_compiles_and_logs_compile_time(compiled_fit) -> None:
    callback, _, logger = compiled_fit
    # The positive control: dynamo compiled frames (a first call's wall time alone is positive eagerly too).
    assert callback.frames_compiled > 0
    eager_before = torch._dynamo.utils.counters["frames"]["ok"]
    fit_toy([])
    assert torch._dynamo.utils.counters["frames"]["ok"] == eager_before  # and without the callback, none
    assert callback.compile_s > 0
    logged = logger.values("time/compile_s")
    assert logged and logged[-1] == pytest.approx(callback.compile_s)
    restored = TorchCompile()
    restored.load_state_dict(callback.state_dict())
    assert restored.compile_s == callback.compile_s


class WrappedAtFirstBatch(pl.Callback):
    """Records which methods carry wrappers while the first batch trains."""

    def __init__(self) -> None:
        self.wrapped: dict[str, int] | None = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.wrapped is None:
            self.wrapped = wrapped_paths(pl_module)


def test_compile_compiles_the_regions_of_update_in_its_place() -> None:
    callback, seen = TorchCompile(backend="aot_eager"), WrappedAtFirstBatch()
    torch._dynamo.reset()
    module, _, _ = fit_toy([callback, seen], module_cls=WithCompileRegions)
    # The losses and act were compiled, update itself was not: it runs its backward passes and optimizer
    # steps eagerly, between the compiled losses.
    assert callback.compiled_functions == ("critic_loss", "actor_loss", "act")
    assert seen.wrapped == {"critic_loss": 1, "actor_loss": 1, "act": 1}
    entries = torch._dynamo.eval_frame._debug_get_cache_entry_list
    assert len(entries(WithCompileRegions.critic_loss)) == len(entries(WithCompileRegions.actor_loss)) == 1
    assert len(entries(WithCompileRegions.update)) == 0
    assert_state_close(module, baseline_state(), atol=COMPILE_ATOL)  # the same math as the plain toy's
    assert not {"critic_loss", "actor_loss", "act"} & module.__dict__.keys() and wrapped_paths(module) == {}


def test_compile_without_regions_compiles_the_whole_path() -> None:
    callback, seen = TorchCompile(backend="aot_eager", paths=["update"], regions=False), WrappedAtFirstBatch()
    torch._dynamo.reset()
    fit_toy([callback, seen], module_cls=WithCompileRegions, steps=2)
    assert callback.compiled_functions == ("update",) and seen.wrapped == {"update": 1}
    assert len(torch._dynamo.eval_frame._debug_get_cache_entry_list(WithCompileRegions.update)) > 0


def test_compile_refuses_a_region_that_is_no_method() -> None:
    with pytest.raises(TypeError, match="value_loss is a compile region of 'update' but is no method"):
        fit_toy([TorchCompile()], module_cls=WithUnknownRegion)
    with pytest.raises(ValueError, match="regions='yes' must be True or False"):
        TorchCompile(regions="yes")


# --- CudaGraphs ------------------------------------------------------------------------------------------


def test_cuda_graphs_rejects_bad_warmup() -> None:
    for warmup in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="warmup"):
            CudaGraphs(warmup=warmup)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU no-op")
def test_cuda_graphs_is_a_noop_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    callback = CudaGraphs()
    with caplog.at_level(logging.INFO):
        module, _, _ = fit_toy([callback])
    assert "CudaGraphs: no CUDA device" in caplog.text
    assert not callback.enabled and callback.graphs_captured == 0
    assert "capturable" not in module.optimizer_kwargs
    assert_state_close(module, baseline_state(), atol=0)
    assert_restored(module)


def test_cuda_graphs_refuses_paths_not_declared_safe() -> None:
    module = ToyProtocolModule()
    module.cuda_graph_safe = ("act",)
    with pytest.raises(ValueError, match=r"\['update'\] of ToyProtocolModule are not declared CUDA-graph"):
        CudaGraphs().check_module(module)
    assert CudaGraphs(paths=["act"]).check_module(module) == ("act",)


def _fake_trainer(callbacks: list, precision: str = "32-true", world_size: int = 1) -> SimpleNamespace:
    return SimpleNamespace(callbacks=callbacks, precision=precision, world_size=world_size)


def test_cuda_graphs_refuses_bad_combinations() -> None:
    graphs = CudaGraphs()
    with pytest.raises(RuntimeError, match="Put TorchCompile before CudaGraphs"):
        graphs._check_trainer(_fake_trainer([graphs, TorchCompile()]))
    graphs._check_trainer(_fake_trainer([TorchCompile(), graphs]))
    with pytest.raises(RuntimeError, match="records CUDA graphs itself"):
        graphs._check_trainer(_fake_trainer([TorchCompile(mode="reduce-overhead"), graphs]))
    with pytest.raises(RuntimeError, match="GradScaler"):
        graphs._check_trainer(_fake_trainer([graphs], precision="16-mixed"))
    with pytest.raises(RuntimeError, match="single process"):
        graphs._check_trainer(_fake_trainer([graphs], world_size=2))


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_match_eager_on_gpu() -> None:
    kwargs = {"accelerator": "gpu", "steps": 12}
    callback = CudaGraphs(warmup=3)
    module, _, trainer = fit_toy([callback], **kwargs)
    eager, _, eager_trainer = fit_toy(**kwargs)
    assert callback.graphs_captured == 2  # update and act
    # 12 updates and 12 act calls, each path 3 warm-up calls and a capture: the rest are replays.
    assert callback.graph_replays == 2 * (12 - 4)
    assert_state_close(module, {k: v.cpu() for k, v in eager.state_dict().items()}, atol=1e-5)
    # Replays run no Python: the callback keeps Lightning's optimizer-step count right.
    assert trainer.global_step == eager_trainer.global_step
    assert module.optimizer_kwargs["capturable"] is True
    assert all(o.defaults["capturable"] for o in trainer.optimizers)
    assert_restored(module)


@pytest.mark.gpu
@needs_cuda
def test_cuda_graphs_refuse_non_capturable_path_on_gpu() -> None:
    class NotSafe(ToyProtocolModule):
        cuda_graph_safe = ("act",)

    with pytest.raises(ValueError, match="not declared CUDA-graph safe"):
        fit_toy([CudaGraphs()], accelerator="gpu", module_cls=NotSafe)


@pytest.mark.gpu
@needs_cuda
def test_compile_then_graphs_on_gpu() -> None:
    module, _, _ = fit_toy([TorchCompile(), CudaGraphs(warmup=3)], accelerator="gpu", steps=12)
    eager, _, _ = fit_toy(accelerator="gpu", steps=12)
    assert_state_close(module, {k: v.cpu() for k, v in eager.state_dict().items()}, atol=1e-4)
    assert_restored(module)


# --- MixedPrecision --------------------------------------------------------------------------------------


def test_mixed_precision_rejects_bad_dtype() -> None:
    with pytest.raises(ValueError, match="use 'bf16' or 'fp16'"):
        MixedPrecision(dtype="fp8")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_mixed_precision_fp16_refused_on_cpu() -> None:
    with pytest.raises(RuntimeError, match=r"needs a CUDA device .*dtype='bf16'"):
        fit_toy([MixedPrecision(dtype="fp16")])


def test_mixed_precision_refuses_conflicting_trainer_precision() -> None:
    with pytest.raises(RuntimeError, match="precision='bf16-true'"):
        fit_toy([MixedPrecision(dtype="bf16")], precision="bf16-true")


def test_mixed_precision_bf16_on_cpu_close_to_fp32() -> None:
    module, datamodule, _ = fit_toy([MixedPrecision(dtype="bf16")])
    diff = max_abs_diff(module, baseline_state())
    assert 0 < diff < BF16_ATOL  # autocast did act, within the stated tolerance
    assert datamodule.action_dtypes == {torch.float32}  # act's bf16 outputs are cast back for the env
    assert_restored(module)


@pytest.mark.gpu
@needs_cuda
def test_mixed_precision_fp16_with_lightning_scaler_on_gpu() -> None:
    module, datamodule, trainer = fit_toy([MixedPrecision("fp16")], accelerator="gpu", precision="16-mixed")
    assert trainer.precision_plugin.scaler is not None
    assert datamodule.action_dtypes == {torch.float32}
    assert all(torch.isfinite(p).all() for p in module.parameters())
    with pytest.raises(RuntimeError, match="GradScaler"):
        fit_toy([MixedPrecision("fp16"), CudaGraphs()], accelerator="gpu", precision="16-mixed")


# --- composition -----------------------------------------------------------------------------------------


def test_all_cheap_callbacks_together_on_cpu() -> None:
    chain = [
        NonBlockingTransfer(),
        TF32(),
        FusedOptimizer(),
        MixedPrecision("bf16"),
        CudaGraphs(),
        GPUMonitor(),
        ThroughputMonitor(log_every_n_steps=4),
        CudaCacheClearing(every_n_steps=5),
    ]
    module, datamodule, trainer = fit_toy(chain)
    assert 0 < max_abs_diff(module, baseline_state()) < BF16_ATOL
    assert all(o.defaults["fused"] for o in trainer.optimizers)
    assert "transfer_batch_to_device" not in datamodule.__dict__
    assert_restored(module)


def test_hot_paths_restored_after_an_exception() -> None:
    created: list[ToyProtocolModule] = []

    class Exploding(ToyProtocolModule):
        def __init__(self) -> None:
            super().__init__()
            created.append(self)

        def training_step(self, batch, batch_idx: int) -> None:
            if batch_idx == 3:
                raise RuntimeError("boom")
            super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match="boom"):
        fit_toy([MixedPrecision("bf16")], module_cls=Exploding)
    assert_restored(created[0])
