"""``DirectSteps`` skips Lightning's manual-optimization wrappers only where they would add nothing.

With it the module steps its optimizers and backpropagates directly when the Trainer runs on one device in
full precision and nobody implements a step hook. The result must be the same parameters and the same
``trainer.global_step`` as through the wrappers, a hook that is implemented must still be called, and the
module gets its Lightning optimizers back after the fit. (Its equivalence per algorithm is in the
``test_callbacks_equivalence*`` files.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import lightning as L
import pytest
import torch
from helpers.batches import N_ACTIONS, OBS_DIM, discrete_specs, transitions
from lightning.pytorch.core.optimizer import LightningOptimizer
from tensordict import TensorDict
from torch.optim.optimizer import register_optimizer_step_pre_hook

from callbacks import DirectSteps
from callbacks.direct_steps import STEP_HOOKS, CountedStep, why_wrappers_needed
from rl_lightning.algos.dqn import DQN

UPDATES = 7


class _Samples(L.LightningDataModule):
    def train_dataloader(self) -> Iterator[TensorDict]:
        # One sample per update (a list would be several loaders): 32 transitions, 30% terminal.
        return (transitions(32, OBS_DIM, N_ACTIONS, i, terminated=0.3) for i in range(UPDATES))


def _module(cls: type[DQN] = DQN) -> DQN:
    torch.manual_seed(0)
    return cls(*discrete_specs(), hidden_sizes=(8,), target_update="hard", hard_update_every=3)


def _trainer(callbacks: list[L.Callback] | None = None, **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu", devices=1, max_epochs=1, logger=False, callbacks=callbacks or [],
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **kwargs,
    )  # fmt: skip


class _CountHooks(L.Callback):
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self.calls["on_before_backward"] += 1

    def on_after_backward(self, trainer, pl_module) -> None:
        self.calls["on_after_backward"] += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.calls["on_before_optimizer_step"] += 1


class _SeesOptimizers(L.Callback):
    """What ``update`` gets from ``module.optimizer()`` during the fit."""

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        self.seen = type(pl_module.optimizer())


def test_direct_steps_give_the_wrappers_parameters_and_step_count() -> None:
    direct, sees = DirectSteps(), _SeesOptimizers()
    plain, plain_trainer = _module(), _trainer([direct, sees])
    plain_trainer.fit(plain, datamodule=_Samples())
    hooks, wrapped_direct = _CountHooks(), DirectSteps()
    wrapped, wrapped_trainer = _module(), _trainer([hooks, wrapped_direct])
    wrapped_trainer.fit(wrapped, datamodule=_Samples())

    assert direct.direct_fits == 1 and sees.seen is CountedStep
    assert wrapped_direct.direct_fits == 0  # _CountHooks implements the step hooks: the wrappers stay
    assert why_wrappers_needed(wrapped_trainer, wrapped) == "_CountHooks.on_before_backward"
    assert plain.direct_optimizers is None  # given back after the fit
    assert isinstance(plain.optimizer(), LightningOptimizer)
    # The implemented hooks ran once per update; the direct path did the same math and counted its steps.
    assert hooks.calls == dict.fromkeys(STEP_HOOKS, UPDATES)
    assert plain_trainer.global_step == wrapped_trainer.global_step == UPDATES
    assert int(plain.num_updates) == UPDATES
    for key, value in wrapped.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[key], value, atol=0, rtol=0, msg=key)
    assert not torch.equal(plain.online[0].weight, _module().online[0].weight)  # it did train


class _ModuleHook(DQN):
    def on_after_backward(self) -> None:
        pass


@pytest.mark.parametrize(
    ("module_cls", "trainer_kwargs", "reason"),
    [
        (_ModuleHook, {}, "_ModuleHook.on_after_backward"),
        (DQN, {"precision": "bf16-mixed"}, "the MixedPrecision plugin"),
        (DQN, {"profiler": "simple"}, "Lightning's profiler"),
    ],
    ids=["module-hook", "mixed-precision", "profiler"],
)
def test_wrappers_kept_where_they_do_something(module_cls: type[DQN], trainer_kwargs: dict, reason: str):
    assert why_wrappers_needed(_trainer(), _module()) is None
    assert why_wrappers_needed(_trainer(**trainer_kwargs), _module(module_cls)).startswith(reason)


def test_a_module_without_the_protocol_is_refused() -> None:
    with pytest.raises(TypeError, match="direct_optimizers"):
        DirectSteps().on_fit_start(_trainer(), L.LightningModule())


def test_counted_step_zeroes_gradients_in_place_or_drops_them() -> None:
    net = torch.nn.Linear(3, 2)
    opt = CountedStep(torch.optim.Adam(net.parameters()), progress=None)
    net(torch.ones(4, 3)).sum().backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g.abs().sum() > 0 for g in grads)
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is g and not g.any() for p, g in zip(net.parameters(), grads))  # same tensors, zeros
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    opt.zero_grad(set_to_none=False)  # nothing to zero: no error, still no gradients
    assert all(p.grad is None for p in net.parameters())


class _Progress:
    """Lightning's step progress, as far as ``CountedStep`` uses it."""

    def __init__(self) -> None:
        self.steps = 0

    def increment_ready(self) -> None:
        pass

    def increment_completed(self) -> None:
        self.steps += 1


def _net() -> torch.nn.ModuleDict:
    torch.manual_seed(0)
    return torch.nn.ModuleDict(
        {"a": torch.nn.Linear(5, 7), "b": torch.nn.Linear(7, 3), "unused": torch.nn.Linear(2, 2)}
    )


def _groups(net: torch.nn.ModuleDict) -> list[dict]:
    """Two groups with their own learning rates; the ``unused`` layer never gets a gradient."""
    return [
        {"params": list(net["a"].parameters()), "lr": 0.01},
        {"params": [*net["b"].parameters(), *net["unused"].parameters()], "lr": 0.003},
    ]


@pytest.mark.parametrize(
    ("cls", "kwargs"),
    [(torch.optim.Adam, {}), (torch.optim.Adam, {"weight_decay": 0.1, "maximize": True}),
     (torch.optim.AdamW, {"weight_decay": 0.1})],
    ids=["adam", "adam-l2-maximize", "adamw"],
)  # fmt: skip
def test_counted_step_calls_the_fused_adam_kernel_directly_with_the_same_bits(cls, kwargs) -> None:
    ref_net, net = _net(), _net()
    ref = cls(_groups(ref_net), fused=True, **kwargs)
    opt = CountedStep(cls(_groups(net), fused=True, **kwargs), progress=_Progress())
    g = torch.Generator().manual_seed(1)
    taken = []
    for _ in range(6):
        for name in ("a", "b"):
            for p_ref, p in zip(ref_net[name].parameters(), net[name].parameters()):
                p_ref.grad = torch.randn(p.shape, generator=g)
                p.grad = p_ref.grad.clone()
        ref.step()
        taken.append(opt._fused_adam_step())
        if not taken[-1]:
            opt.optimizer.step()
    assert taken == [False] + [True] * 5  # Adam.step itself makes the state at the first step
    for (name, p_ref), p in zip(ref_net.named_parameters(), net.parameters()):
        assert torch.equal(p_ref, p), name
    assert not torch.equal(net["a"].weight, _net()["a"].weight)  # it did step
    assert net["unused"].weight not in opt.optimizer.state  # no gradient, no state, as in Adam.step
    used = [(p_ref, p) for p_ref, p in zip(ref_net.parameters(), net.parameters()) if p_ref in ref.state]
    assert len(used) == len(opt.optimizer.state) == 4
    for p_ref, p in used:
        s_ref, s = ref.state[p_ref], opt.optimizer.state[p]
        assert s_ref.keys() == s.keys() and all(torch.equal(s_ref[k], s[k]) for k in s_ref)
    opt.step()
    assert opt._progress.steps == 1  # counted as an optimizer step


@pytest.mark.parametrize(
    "change",
    ["pre-hook", "post-hook", "global-hook", "amsgrad", "not-fused", "tensor-lr", "grad-scaler", "sgd"],
)
def test_counted_step_leaves_the_step_to_the_optimizer_where_it_does_more(change: str) -> None:
    net = torch.nn.Linear(3, 2)
    kwargs = {"amsgrad": change == "amsgrad", "fused": change != "not-fused"}
    if change == "tensor-lr":
        kwargs["lr"] = torch.tensor(0.01)
    if change == "sgd":
        inner = torch.optim.SGD(net.parameters(), lr=0.1, fused=True)
    else:
        inner = torch.optim.Adam(net.parameters(), **kwargs)
    calls, handle = [], None
    if change == "pre-hook":
        handle = inner.register_step_pre_hook(lambda *args: calls.append(change))
    elif change == "post-hook":
        handle = inner.register_step_post_hook(lambda *args: calls.append(change))
    elif change == "global-hook":
        handle = register_optimizer_step_pre_hook(lambda *args: calls.append(change))
    elif change == "grad-scaler":
        inner.grad_scale = torch.ones(())  # what GradScaler.step leaves on a fused optimizer
    opt = CountedStep(inner, progress=_Progress())
    try:
        for _ in range(3):
            net(torch.ones(4, 3)).sum().backward()
            opt.step()
            assert not opt._fused_adam_step()
    finally:
        if handle is not None:
            handle.remove()
    assert opt._progress.steps == 3
    assert calls == ([change] * 3 if change.endswith("hook") else [])
