"""Optimizer steps and backward passes without Lightning's per-step hook dispatch where it does nothing."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import SingleDeviceStrategy
from typing_extensions import override

from callbacks._compat import (
    HAS_DIRECT_STEPS,
    foreach_add_,
    foreach_zero_,
    fused_adam_kernel,
    has_step_hooks,
    manual_step_progress,
)
from callbacks._logging import notice_once

#: Whether this torch has the private pieces the direct steps use (``callbacks._compat.HAS_DIRECT_STEPS``):
#: the multi-tensor ``_foreach_zero_``/``_foreach_add_``, the fused Adam kernels, and the hook registries
#: (global and per optimizer) that must be empty. Without one of them every step is ``Optimizer.zero_grad``
#: and ``Optimizer.step``: the same bits, the speed-up lost. :class:`CountedStep` takes it as ``fast``.
FAST_STEPS = HAS_DIRECT_STEPS

#: The hooks Lightning's manual-optimization wrappers (``manual_backward``, ``LightningOptimizer.step``)
#: dispatch on every backward pass and optimizer step.
STEP_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")

#: The optimizers :meth:`CountedStep._fused_adam_step` steps with their fused kernel.
_ADAMS = (torch.optim.Adam, torch.optim.AdamW)


def why_wrappers_needed(trainer: pl.Trainer, pl_module: pl.LightningModule) -> str | None:
    """Why Lightning's backward and optimizer-step wrappers would do more than plain PyTorch calls here
    (``None``: they would only walk the callbacks for hooks nobody implements)."""
    if type(trainer.strategy) is not SingleDeviceStrategy:
        return f"the {type(trainer.strategy).__name__} strategy (it may sync or scale gradients)"
    if type(trainer.precision_plugin) is not Precision:
        return f"the {type(trainer.precision_plugin).__name__} plugin (autocast, grad scaling)"
    if not isinstance(trainer.profiler, PassThroughProfiler):
        return "Lightning's profiler (it times the wrapped steps)"
    if type(pl_module).backward is not pl.LightningModule.backward:
        return f"{type(pl_module).__name__}.backward"
    owners = [(pl_module, pl.LightningModule), *((cb, Callback) for cb in trainer.callbacks)]
    for obj, base in owners:
        for hook in STEP_HOOKS:
            if getattr(type(obj), hook) is not getattr(base, hook):
                return f"{type(obj).__name__}.{hook}"
    return None


class CountedStep:
    """An optimizer whose ``step`` counts in Lightning's manual-optimization progress
    (``trainer.global_step``), as ``LightningOptimizer.step`` does, without the hook dispatch.

    A fused ``Adam``/``AdamW`` on the CPU steps with its kernel called directly (:meth:`_fused_adam_step`).
    ``fast=False`` (or a torch without ``FAST_STEPS``) steps through ``Optimizer.step`` always.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, progress: Any, fast: bool = FAST_STEPS) -> None:
        self.optimizer, self._progress, self.fast = optimizer, progress, fast

    def zero_grad(self, set_to_none: bool = True) -> None:
        """``Optimizer.zero_grad``; zeroing in place is one ``_foreach_zero_`` over the existing gradients
        (what ``zero_grad`` does after its per-parameter checks and grouping, 4 instead of 18 us for a
        small network on a CPU) when they are plain dense tensors on one device, and dropping them is a
        plain loop (0.4 instead of 8 us for SAC's critics: ``zero_grad`` adds a profiler range around it)."""
        if set_to_none:
            for group in self.optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None
            return
        grads = [p.grad for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if (
            self.fast
            and grads
            and all(g.device == grads[0].device and not g.requires_grad and not g.is_sparse for g in grads)
        ):
            foreach_zero_(grads)
            return
        self.optimizer.zero_grad(set_to_none=False)

    def step(self) -> None:
        self._progress.increment_ready()
        if not self._fused_adam_step():
            self.optimizer.step()
        self._progress.increment_completed()

    def _fused_adam_step(self) -> bool:
        """``Adam.step`` / ``AdamW.step`` of a fused optimizer on the CPU as its two calls: the step counters'
        ``_foreach_add_`` and the ``_fused_adam_`` (``_fused_adamw_``) kernel, with the same arguments, so the
        same bits. ``False`` (nothing done) where ``step`` itself must run.

        What ``step`` adds around those calls costs as much as the kernel for a small network (84 against
        46 us per step of a ``[256, 256]`` Q-network): its hooks, the tensors' grouping by device and dtype,
        the checks of every parameter and the profiler's range. The direct call is taken when none of it
        does anything: no step hooks (the optimizer's or global ones), no ``GradScaler`` state on the
        optimizer, every group fused, without amsgrad, capturable or differentiable, with plain-number
        ``lr`` and betas, and every parameter with a gradient already stepped once (``step`` creates the
        state on the first step) and a dense floating-point CPU tensor of its group's dtype.
        """
        opt = self.optimizer
        if (
            not self.fast
            or type(opt) not in _ADAMS
            or has_step_hooks(opt)
            or getattr(opt, "grad_scale", None) is not None
            or getattr(opt, "found_inf", None) is not None
        ):
            return False
        calls = []
        for group in opt.param_groups:
            beta1, beta2 = group["betas"]
            if (
                not group["fused"]
                or group["amsgrad"]
                or group["capturable"]
                or group["differentiable"]
                or type(group["lr"]) is not float
                or type(beta1) is not float
                or type(beta2) is not float
            ):
                return False
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            dtype, states = params[0].dtype, []
            if not dtype.is_floating_point:
                return False
            for p in params:  # a gradient has its parameter's dtype (torch checks it when it is set)
                state = opt.state.get(p)
                if not state or not p.is_cpu or p.dtype is not dtype or p.grad.is_sparse:
                    return False
                states.append(state)
            calls.append((group, beta1, beta2, params, states))
        with torch.no_grad():
            for group, beta1, beta2, params, states in calls:
                steps = [s["step"] for s in states]
                foreach_add_(steps, 1)
                decoupled = group.get("decoupled_weight_decay", type(opt) is torch.optim.AdamW)
                kernel = fused_adam_kernel(decoupled)
                kernel(
                    params,
                    [p.grad for p in params],
                    [s["exp_avg"] for s in states],
                    [s["exp_avg_sq"] for s in states],
                    [],
                    steps,
                    amsgrad=False,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=group["maximize"],
                    grad_scale=None,
                    found_inf=None,
                )
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


class DirectSteps(Callback):
    """Step the optimizers and backpropagate directly where Lightning's wrappers would add nothing.

    Under manual optimization every ``manual_backward`` and ``LightningOptimizer.step`` walks all callbacks
    (and the module) for ``on_before_backward``, ``on_after_backward`` and ``on_before_optimizer_step``,
    through the strategy, the precision plugin and the profiler. On one device in full precision, without
    Lightning's profiler and with none of those hooks implemented, that walk does nothing but costs: about
    0.4 ms of a 2.8 ms DQN update on a CPU (``benchmarks/results/dqn_overhead.json``). In ``on_fit_start``
    this callback then hands the module its optimizers wrapped in :class:`CountedStep` (still counted in
    ``trainer.global_step``) as ``direct_optimizers``; the module steps those and calls plain
    ``loss.backward()`` while they are set. Anything that needs the wrappers (another strategy, mixed or
    half precision, a profiler, a hook) keeps them, with a notice saying why. ``on_fit_end`` takes the
    optimizers back.

    Protocol: the module has an attribute ``direct_optimizers`` (``None`` when it is not given any) that its
    update uses in place of ``self.optimizers()`` and ``manual_backward`` while it is set
    (``rl_lightning.algos.base.RLModule``); a module without it is refused.

    Metrics: none. State: none. ``direct_fits`` counts the fits it took the steps over in.

    Example:
        >>> trainer = pl.Trainer(callbacks=[DirectSteps()])
    """

    def __init__(self) -> None:
        self.direct_fits = 0

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not hasattr(pl_module, "direct_optimizers"):
            raise TypeError(
                f"DirectSteps needs {type(pl_module).__name__} to implement its protocol: an attribute "
                "`direct_optimizers` (None by default) whose optimizers update steps, with a plain "
                "`loss.backward()`, while it is set."
            )
        reason = why_wrappers_needed(trainer, pl_module)
        if reason is not None or pl_module.automatic_optimization:
            reason = reason or "automatic optimization"
            notice_once(self, f"DirectSteps: Lightning's optimizer-step wrappers kept for {reason}.")
            return
        progress = manual_step_progress(trainer)
        if progress is None:
            notice_once(
                self, "DirectSteps: Lightning's optimizer-step wrappers kept: it counts steps elsewhere."
            )
            return
        pl_module.direct_optimizers = [CountedStep(o, progress) for o in trainer.optimizers]
        self.direct_fits += 1

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if getattr(pl_module, "direct_optimizers", None) is not None:
            pl_module.direct_optimizers = None

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self.on_fit_end(trainer, pl_module)
