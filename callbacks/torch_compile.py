"""``torch.compile`` for the module's hot paths."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import lightning.pytorch as pl
import torch
from typing_extensions import override

from callbacks._logging import log_metrics, notice_once
from callbacks._protocol import (
    HotPathCallback,
    check_paths_argument,
    resolve_compile_regions,
    resolve_hot_paths,
    wrap_hot_path,
)

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Modes in which inductor records CUDA graphs itself (cudagraph trees): the first calls warm up and record.
GRAPH_MODES = ("reduce-overhead", "max-autotune")
# Backends dynamo lists only among its debugging tools: traced graphs run on eager kernels.
DEBUG_BACKENDS = ("aot_eager", "eager")


class TorchCompile(HotPathCallback):
    """Compile the module's hot paths (``update``, ``act``) with ``torch.compile`` for the fit.

    In ``on_fit_start`` (the module is on its device) every selected hot path, or, where the module
    declares them, the path's compile regions, is replaced by
    ``torch.compile(current, mode=..., fullgraph=..., dynamic=..., backend=...)``, where ``current`` is
    whatever is there (the method, or a wrapper from a callback listed earlier);
    ``on_fit_end``/``teardown``/``on_exception`` put the methods back. Compilation is lazy: it happens on
    each function's first call.

    Compile regions (``compile_regions``, see ``callbacks._protocol``): an ``update`` runs backward passes
    and optimizer steps, where dynamo breaks the graph, and a break in the middle of a function makes dynamo
    trace the code before it twice (once to find the break, once to compile up to it), the losses included.
    An algorithm whose update variants differ (TD3's critic-only and full updates) also gets the whole update
    traced once per variant. Its losses, compiled as functions of their own, trace once and form one graph
    each (forward and backward, through AOTAutograd); the backward calls, the optimizer steps and the target
    updates between them run eagerly (``benchmarks/compile_regions.py`` measures both ways).
    ``regions=False`` compiles every selected path whole.

    Ordering: list ``MixedPrecision`` (if any) before ``TorchCompile`` and ``CudaGraphs`` after it, so the
    autocast region is traced into the compiled graph and the CUDA graph captures the compiled code.
    ``mode="reduce-overhead"``/``"max-autotune"`` record CUDA graphs inside inductor and cannot be combined
    with ``CudaGraphs`` (which refuses); use ``"default"`` or ``"max-autotune-no-cudagraphs"`` with it.

    Compiled whole (``regions=False``, or a module without regions), an ``update`` breaks its graph at every
    backward pass and optimizer step: keep ``fullgraph=False`` then. Regions have no break, so
    ``fullgraph=True`` checks that. With ``dynamic=False`` each new input shape (e.g. a different number of
    eval environments in ``act``) compiles once more.

    Metrics:
        ``time/compile_s``: wall time of the first call of each compiled function (compilation plus one
        run; in the graph modes the first three calls, which also record graphs), summed; logged after each
        training batch during which a path was still warming up. ``ThroughputMonitor`` leaves its first
        window out, so throughput figures exclude compilation. Measured on the host without a device sync:
        compile time dominates it.

    Args:
        mode: a ``torch.compile`` mode: ``"default"``, ``"reduce-overhead"``, ``"max-autotune"`` or
            ``"max-autotune-no-cudagraphs"``.
        fullgraph: fail on graph breaks instead of splitting the graph.
        dynamic: ``False`` specializes on shapes, ``True`` compiles shape-generic code, ``None`` lets
            dynamo decide after a recompilation.
        paths: hot paths to compile; ``None`` compiles all of the module's ``hot_paths``.
        backend: the dynamo backend. ``"inductor"`` generates fused kernels (what makes compiled code
            fast); ``"aot_eager"`` traces the same forward and backward graphs through AOTAutograd and runs
            them with eager kernels, without code generation: to tell a tracing problem from a code
            generation one, and for checks of what tracing does to an update's results, at a fraction of
            inductor's compile time on a cold cache.
        regions: compile the module's ``compile_regions`` in place of the paths that have them; ``False``
            compiles every selected path whole.

    Example:
        >>> trainer = pl.Trainer(callbacks=[TorchCompile(mode="default"), CudaGraphs(warmup=3)])
    """

    def __init__(
        self,
        mode: str = "default",
        fullgraph: bool = False,
        dynamic: bool | None = False,
        paths: Sequence[str] | None = None,
        backend: str = "inductor",
        regions: bool = True,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"TorchCompile: mode={mode!r} is not a torch.compile mode; use one of {MODES}.")
        backends = sorted({*torch.compiler.list_backends(), *DEBUG_BACKENDS})
        if backend not in backends:
            raise ValueError(
                f"TorchCompile: backend={backend!r} is not a dynamo backend; use one of {backends}."
            )
        if backend != "inductor" and mode != "default":
            raise ValueError(
                f"TorchCompile: mode={mode!r} is inductor's; use mode=default with backend={backend!r}."
            )
        if not isinstance(regions, bool):
            raise ValueError(f"TorchCompile: regions={regions!r} must be True or False.")
        if not isinstance(fullgraph, bool):
            raise ValueError(f"TorchCompile: fullgraph={fullgraph!r} must be True or False.")
        if dynamic is not None and not isinstance(dynamic, bool):
            raise ValueError(f"TorchCompile: dynamic={dynamic!r} must be True, False or None.")
        self.mode = mode
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.paths = check_paths_argument(paths, "TorchCompile")
        self.backend = backend
        self.regions = regions
        self.compile_s = 0.0
        #: The functions compiled in the current fit: the selected paths, or their compile regions.
        self.compiled_functions: tuple[str, ...] = ()
        self._pending_log = False

    @property
    def warmup_calls(self) -> int:
        """Calls per compiled function counted as compilation/warm-up in ``time/compile_s``."""
        return 3 if self.mode in GRAPH_MODES else 1

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        selected = resolve_hot_paths(pl_module, self.paths, "TorchCompile")
        self.compiled_functions = tuple(
            name
            for path in selected
            for name in (
                resolve_compile_regions(pl_module, path, "TorchCompile") if self.regions else (path,)
            )
        )
        if self.mode in GRAPH_MODES and trainer.strategy.root_device.type != "cuda":
            notice_once(
                self,
                f"TorchCompile: mode={self.mode!r} records CUDA graphs only on CUDA; "
                "on CPU inductor skips them.",
            )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for name in self.compiled_functions:
            wrap_hot_path(pl_module, name, self._compile, owner=self)

    def _compile(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        compiled = torch.compile(
            fn, mode=self.mode, fullgraph=self.fullgraph, dynamic=self.dynamic, backend=self.backend
        )
        calls = 0

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            if calls >= self.warmup_calls:
                return compiled(*args, **kwargs)
            start = time.perf_counter()
            out = compiled(*args, **kwargs)
            self.compile_s += time.perf_counter() - start
            calls += 1
            self._pending_log = True
            return out

        run.compiled = compiled  # type: ignore[attr-defined]
        return run

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._pending_log:
            self._pending_log = False
            log_metrics(trainer, {"time/compile_s": self.compile_s})

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"compile_s": self.compile_s}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.compile_s = float(state_dict.get("compile_s", 0.0))
