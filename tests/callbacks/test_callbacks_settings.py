"""TF32, NonBlockingTransfer, FusedOptimizer and CudaCacheClearing."""

from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from helpers.toy import (
    ToyDataModule,
    ToyProtocolModule,
    WithoutOptimizerKwargs,
    assert_state_close,
    baseline_state,
    fit_toy,
)
from tensordict import TensorDict

from callbacks import TF32, CudaCacheClearing, FusedOptimizer, NonBlockingTransfer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
on_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")

# torch's fused Adam kernel differs from the for-loop one only by rounding: measured 6e-8 after 12 steps.
FUSED_ATOL = 1e-6


def fake_trainer(device: str, datamodule: object = None) -> SimpleNamespace:
    """Enough of a Trainer for ``setup``: the device decides what the callbacks do."""
    return SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)), datamodule=datamodule)


def tf32_flags() -> tuple[bool, bool]:
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32


@pytest.fixture
def keep_tf32_flags():
    saved = tf32_flags()
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# --- TF32 ------------------------------------------------------------------------------------------------


def test_tf32_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="enable one or remove"):
        TF32(matmul=False, cudnn=False)
    with pytest.raises(ValueError, match="must be True or False"):
        TF32(matmul="yes")


@pytest.mark.parametrize("initial", [(False, False), (False, True), (True, False)])
def test_tf32_restores_previous_flags(initial: tuple[bool, bool], keep_tf32_flags) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = initial
    callback = TF32()
    callback.setup(fake_trainer("cuda"), ToyProtocolModule(), "fit")
    assert tf32_flags() == (True, True)
    assert torch.get_float32_matmul_precision() == "high"
    callback.on_exception(None, None, RuntimeError("boom"))
    assert tf32_flags() == initial
    callback.teardown(None, None, "fit")  # a second restore changes nothing
    assert tf32_flags() == initial


def test_tf32_matmul_only(keep_tf32_flags) -> None:
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
    callback = TF32(matmul=True, cudnn=False)
    callback.apply_flags()
    assert tf32_flags() == (True, False)
    callback.restore_flags()
    assert tf32_flags() == (False, False)


@on_cpu_only
def test_tf32_is_a_noop_on_cpu(keep_tf32_flags, caplog: pytest.LogCaptureFixture) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    seen: list[tuple[bool, bool]] = []

    class Probe(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            seen.append(tf32_flags())

    before = tf32_flags()
    with caplog.at_level(logging.INFO):
        module, _, _ = fit_toy([TF32(), Probe()])
    assert seen == [before] and tf32_flags() == before
    assert "TF32: no CUDA device" in caplog.text
    assert_state_close(module, baseline_state(), atol=0)


@pytest.mark.gpu
@needs_cuda
def test_tf32_changes_a_matmul_on_a_gpu_that_has_it(keep_tf32_flags) -> None:
    """TF32 acts: a float32 matmul with the callback's flags differs from the full-precision one (by about
    TF32's 10 mantissa bits), and the control, the same product twice without them, does not differ."""
    if torch.cuda.get_device_capability() < (8, 0):
        pytest.skip("TF32 needs an Ampere or newer GPU")
    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(512, 512, device="cuda", generator=gen)
    b = torch.randn(512, 512, device="cuda", generator=gen)
    full, again = a @ b, a @ b
    callback = TF32()
    callback.apply_flags()
    try:
        tf32 = a @ b
    finally:
        callback.restore_flags()
    assert torch.equal(full, again)  # the control: no flag, no change
    error = ((tf32 - full).abs().max() / full.abs().max()).item()
    assert 1e-6 < error < 1e-2, error


@pytest.mark.gpu
@needs_cuda
def test_tf32_on_gpu_sets_and_restores(keep_tf32_flags) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    seen: list[tuple[bool, bool]] = []

    class Probe(pl.Callback):
        def on_train_start(self, trainer, pl_module) -> None:
            seen.append(tf32_flags())

    before = tf32_flags()
    fit_toy([TF32(), Probe()], accelerator="gpu")
    assert seen == [(True, True)]
    assert tf32_flags() == before


# --- NonBlockingTransfer ---------------------------------------------------------------------------------


def test_non_blocking_rejects_bad_argument() -> None:
    with pytest.raises(ValueError, match="pin_memory"):
        NonBlockingTransfer(pin_memory="always")


@on_cpu_only
def test_non_blocking_is_a_noop_on_cpu() -> None:
    module, datamodule, _ = fit_toy([NonBlockingTransfer()])
    assert "transfer_batch_to_device" not in module.__dict__
    assert "transfer_batch_to_device" not in datamodule.__dict__
    assert_state_close(module, baseline_state(), atol=0)


def hook_owner(module: pl.LightningModule, datamodule: pl.LightningDataModule | None) -> object:
    """The object whose ``transfer_batch_to_device`` Lightning calls (its own choice, warnings recorded)."""
    from lightning.pytorch.trainer.connectors.data_connector import _DataHookSelector

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "You have overridden ... in both": the shadow must not cause it
        return _DataHookSelector(module, datamodule).get_instance("transfer_batch_to_device")


def test_non_blocking_shadows_the_hook_lightning_calls() -> None:
    module = ToyProtocolModule()
    datamodule = ToyDataModule(module)
    callback = NonBlockingTransfer()
    # With or without a data module (which does not override the hook), Lightning calls the module's,
    # now the shadow, without a warning: the shadow stands in for the default hook.
    for dm in (datamodule, None):
        callback.setup(fake_trainer("cuda", dm), module, "fit")
        assert hook_owner(module, dm) is module
        batch = {"n": 3, "t": torch.zeros(2)}
        moved = module.transfer_batch_to_device(batch, torch.device("cpu"), 0)
        assert moved["t"] is batch["t"] and callback.batches_moved == 1
        assert "transfer_batch_to_device" not in datamodule.__dict__
        callback.on_exception(None, module, RuntimeError("boom"))
        assert "transfer_batch_to_device" not in module.__dict__


def test_non_blocking_leaves_a_data_modules_own_transfer_to_lightning(caplog) -> None:
    class CustomDataModule(ToyDataModule):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return batch

    module = ToyProtocolModule()
    datamodule = CustomDataModule(module)
    callback = NonBlockingTransfer()
    callback.setup(fake_trainer("cuda", datamodule), module, "fit")
    assert hook_owner(module, datamodule) is datamodule  # Lightning's choice, as without the callback
    with caplog.at_level(logging.INFO):
        callback.on_train_batch_start(None, module, None, 0)
    assert "data module's own transfer_batch_to_device moved the batch" in caplog.text
    callback.teardown(None, module, "fit")
    assert "transfer_batch_to_device" not in module.__dict__


def test_non_blocking_leaves_a_custom_transfer_alone() -> None:
    class CustomTransfer(ToyProtocolModule):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            return batch

    module = CustomTransfer()
    NonBlockingTransfer().setup(fake_trainer("cuda"), module, "fit")
    assert "transfer_batch_to_device" not in module.__dict__


def test_non_blocking_transfer_keeps_batches_already_there() -> None:
    on_cpu = TensorDict(observation=torch.ones(4, 3), batch_size=[4], device="cpu")
    deviceless = TensorDict(observation=torch.ones(4, 3), batch_size=[4])
    batch = {"td": on_cpu, "deviceless": deviceless, "tensor": torch.zeros(2), "n": 3}
    moved = NonBlockingTransfer().transfer_batch_to_device(batch, torch.device("cpu"))
    assert moved["td"] is on_cpu and moved["deviceless"] is deviceless
    assert moved["tensor"] is batch["tensor"] and moved["n"] == 3


@pytest.mark.gpu
@needs_cuda
def test_non_blocking_transfer_to_gpu() -> None:
    td = TensorDict(observation=torch.randn(64, 3), nested=TensorDict(x=torch.arange(64)), batch_size=[64])
    moved = NonBlockingTransfer().transfer_batch_to_device(td, torch.device("cuda", 0))
    torch.cuda.current_stream().synchronize()
    assert moved.device.type == "cuda"
    assert torch.equal(moved["observation"].cpu(), td["observation"])
    assert torch.equal(moved["nested", "x"].cpu(), td["nested", "x"])
    module, _, _ = fit_toy([NonBlockingTransfer()], accelerator="gpu")
    eager, _, _ = fit_toy(accelerator="gpu")
    assert_state_close(module, {k: v.cpu() for k, v in eager.state_dict().items()}, atol=1e-6)


# --- FusedOptimizer --------------------------------------------------------------------------------------


def test_fused_rejects_bad_argument() -> None:
    with pytest.raises(ValueError, match="capturable"):
        FusedOptimizer(capturable=1)


def test_fused_optimizer_matches_default_on_cpu() -> None:
    callback = FusedOptimizer()
    module, _, trainer = fit_toy([callback])
    assert callback.fused is True  # torch 2.4+ has fused Adam kernels for CPU
    assert module.optimizer_kwargs == {"fused": True}
    assert [o.defaults["fused"] for o in trainer.optimizers] == [True, True]
    assert_state_close(module, baseline_state(), atol=FUSED_ATOL)


@on_cpu_only
def test_fused_capturable_ignored_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        module, _, _ = fit_toy([FusedOptimizer(capturable=True)])
    assert "capturable" not in module.optimizer_kwargs
    assert "capturable=True is ignored off CUDA" in caplog.text


def test_fused_requires_optimizer_protocol() -> None:
    with pytest.raises(TypeError, match=r"optimizer_kwargs: dict.*\*\*self.optimizer_kwargs"):
        fit_toy([FusedOptimizer()], module_cls=WithoutOptimizerKwargs)


@pytest.mark.gpu
@needs_cuda
def test_fused_capturable_on_gpu() -> None:
    module, _, trainer = fit_toy([FusedOptimizer(capturable=True)], accelerator="gpu")
    assert module.optimizer_kwargs == {"fused": True, "capturable": True}
    assert all(o.defaults["fused"] and o.defaults["capturable"] for o in trainer.optimizers)


# --- CudaCacheClearing -----------------------------------------------------------------------------------


def test_cache_clearing_rejects_bad_interval() -> None:
    for every in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="every_n_steps"):
            CudaCacheClearing(every_n_steps=every)


@on_cpu_only
def test_cache_clearing_is_a_noop_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    callback = CudaCacheClearing(every_n_steps=2)
    with caplog.at_level(logging.INFO):
        module, _, _ = fit_toy([callback])
    assert callback.steps == 12 and callback.clears == 0
    assert "CudaCacheClearing: no CUDA device" in caplog.text
    assert_state_close(module, baseline_state(), atol=0)


def test_cache_clearing_schedule_and_state(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    callback = CudaCacheClearing(every_n_steps=3)
    callback.setup(fake_trainer("cuda"), None, "fit")
    for _ in range(7):
        callback.on_train_batch_end(None, None, None, None, 0)
    assert len(calls) == 2 and callback.clears == 2
    resumed = CudaCacheClearing(every_n_steps=3)
    resumed.load_state_dict(callback.state_dict())
    resumed.setup(fake_trainer("cuda"), None, "fit")
    resumed.on_train_batch_end(None, None, None, None, 0)
    resumed.on_train_batch_end(None, None, None, None, 0)
    assert (resumed.steps, resumed.clears, len(calls)) == (9, 3, 3)  # the schedule continues across resume


class ReservedAtBatchStart(pl.Callback):
    """Frees a ``BLOCK``-byte tensor at each batch end (the allocator keeps it reserved) and records
    ``torch.cuda.memory_reserved()`` at the start of each batch, after the previous batch's callbacks."""

    BLOCK = 256 * 2**20

    def __init__(self) -> None:
        self.reserved: list[int] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.reserved.append(torch.cuda.memory_reserved())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        block = torch.empty(self.BLOCK, dtype=torch.uint8, device=pl_module.device)
        del block  # freed into the cache: still reserved until the cache is emptied


@pytest.mark.gpu
@needs_cuda
def test_cache_clearing_on_gpu_releases_reserved_memory() -> None:
    """Seen through the allocator, not the callback's counter: after each clear (every 4 batches) the
    freed block is no longer reserved; between clears it is. The control: without the callback it stays
    reserved at every batch start."""
    probe = ReservedAtBatchStart()
    callback = CudaCacheClearing(every_n_steps=4)
    fit_toy([probe, callback], accelerator="gpu", steps=12)  # the probe frees its block before the clear
    block = ReservedAtBatchStart.BLOCK
    after_clear = [probe.reserved[i] for i in (4, 8)]  # the starts of batches 5 and 9
    kept = [probe.reserved[i] for i in (2, 3, 6, 7, 10, 11)]
    assert all(r < block for r in after_clear), probe.reserved
    assert all(r >= block for r in kept), probe.reserved
    control = ReservedAtBatchStart()
    fit_toy([control], accelerator="gpu", steps=12)
    assert all(r >= block for r in control.reserved[1:]), control.reserved
