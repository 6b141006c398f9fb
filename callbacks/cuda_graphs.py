"""Capture the module's hot paths as CUDA graphs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from callbacks._compat import manual_step_progress
from callbacks._graphed_path import GraphedPath
from callbacks._logging import notice_once
from callbacks._protocol import (
    HotPathCallback,
    check_paths_argument,
    require_optimizer_kwargs,
    resolve_hot_paths,
    restore_hot_paths,
    wrap_hot_path,
)
from callbacks.torch_compile import GRAPH_MODES, TorchCompile


class CudaGraphs(HotPathCallback):
    """Run the module's hot paths (``update``, ``act``) as CUDA graphs: one launch instead of hundreds.

    Each selected path runs eagerly ``warmup`` times on a side stream (lazy state such as Adam moments
    and cuBLAS workspaces gets allocated, compiled code finishes compiling), is then captured with
    ``torch.cuda.graph`` into static input/output buffers, and is replayed from then on: inputs are copied
    into the static buffers on the current stream (no host sync), the graph is replayed, outputs are cloned.
    A new input signature (keys, shapes, dtypes, grad mode), e.g. ``act`` on the eval envs, gets its own
    warm-up and graph (up to 8 per path, then eager). A graphed path called from inside another graphed path
    runs inline and becomes part of the outer graph.

    Requirements, checked in ``setup`` on CUDA:

    - every selected path is listed in the module's ``cuda_graph_safe`` (static shapes, no host syncs, no
      Python branches on tensor values, detached outputs);
    - optimizers are capturable: ``setup`` sets ``optimizer_kwargs["capturable"] = True`` (the module must
      merge ``optimizer_kwargs`` into its optimizers; checked again in ``on_fit_start``);
    - no GradScaler (``Trainer(precision="16-mixed")`` is refused: its step reads ``found_inf`` on the host)
      and no ``TorchCompile`` mode that records graphs itself (``reduce-overhead``, ``max-autotune``);
    - ``TorchCompile`` comes *before* ``CudaGraphs`` in the callback list: graphs wrap whatever is there
      in ``on_fit_start``, so compile first, then capture the compiled code;
    - a single process (``world_size == 1``).

    Python side effects inside a path run only up to capture: Lightning's optimizer-step counter is kept
    right (the steps a path took while being captured are added after each replay), anything else (Python
    counters, ``self.log`` calls, hooks such as ``on_before_optimizer_step``) is frozen at capture. Keys a
    path writes into its input TensorDict (``act``'s ``"action"``, a loss's ``"td_error"``) are copied into
    the caller's TensorDict after every replay, and a path that returns its input returns the caller's
    TensorDict, as it would eagerly; in-place changes to existing input tensors are not mirrored. Callers
    must look the method up at call time (``module.act(td)``), not keep a bound method taken before
    ``on_fit_start``. Graphs are not checkpointed: after a resume they are captured again.

    On CPU this is a no-op with a one-time notice.

    Metrics: none; ``graphs_captured`` and ``graph_replays`` count what it did (the calls answered by a
    replay are the evidence that the graphs ran, not only that results are equal).

    Args:
        warmup: eager calls per path and input signature before capture (>= 1; use >= 3 after
            ``TorchCompile`` so compilation and autotuning finish before capture).
        paths: hot paths to capture; ``None`` captures all of the module's ``hot_paths``.

    Example:
        >>> trainer = pl.Trainer(callbacks=[TorchCompile(), CudaGraphs(warmup=3)], accelerator="gpu")
    """

    def __init__(self, warmup: int = 3, paths: Sequence[str] | None = None) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
            raise ValueError(
                f"CudaGraphs: warmup={warmup!r} must be an int >= 1 (eager calls before capture; use >= 3 "
                "with TorchCompile so compilation finishes before capture)."
            )
        self.warmup = warmup
        self.paths = check_paths_argument(paths, "CudaGraphs")
        self.enabled = False
        self._selected: tuple[str, ...] = ()
        self._graphed: dict[str, GraphedPath] = {}
        self._captured_before = 0
        self._replays_before = 0

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        if trainer.strategy.root_device.type != "cuda":
            notice_once(self, "CudaGraphs: no CUDA device; hot paths run without graphs.")
            self.enabled = False
            return
        self._selected = self.check_module(pl_module)
        self._check_trainer(trainer)
        # Left in place after the fit: the optimizers were built with it.
        require_optimizer_kwargs(pl_module, "CudaGraphs")["capturable"] = True
        self.enabled = True

    def check_module(self, pl_module: pl.LightningModule) -> tuple[str, ...]:
        """The selected hot paths; raises where one is not declared in ``cuda_graph_safe``."""
        selected = resolve_hot_paths(pl_module, self.paths, "CudaGraphs")
        safe = tuple(getattr(pl_module, "cuda_graph_safe", ()))
        unsafe = [p for p in selected if p not in safe]
        safe_selected = [p for p in selected if p in safe]
        if unsafe:
            raise ValueError(
                f"CudaGraphs: hot paths {unsafe} of {type(pl_module).__name__} are not declared CUDA-graph "
                f"safe (cuda_graph_safe={safe}). Capture only those, CudaGraphs(paths={[*safe_selected]}), "
                "or make the path capturable (static shapes, no host syncs) and add it to `cuda_graph_safe`."
            )
        return selected

    def _check_trainer(self, trainer: pl.Trainer) -> None:
        if trainer.world_size > 1:
            raise RuntimeError(
                "CudaGraphs supports a single process only; remove it for multi-process strategies."
            )
        if str(trainer.precision) == "16-mixed":
            raise RuntimeError(
                "CudaGraphs cannot capture fp16 training: the GradScaler of Trainer(precision='16-mixed') "
                "reads its inf check on the host every step. Use precision='bf16-mixed' (no scaler) or drop "
                "CudaGraphs."
            )
        position = trainer.callbacks.index(self) if self in trainer.callbacks else len(trainer.callbacks)
        for index, callback in enumerate(trainer.callbacks):
            if not isinstance(callback, TorchCompile):
                continue
            if callback.mode in GRAPH_MODES:
                raise RuntimeError(
                    f"CudaGraphs cannot wrap TorchCompile(mode={callback.mode!r}), which records CUDA "
                    "graphs itself; use TorchCompile(mode='default') or 'max-autotune-no-cudagraphs' with "
                    "CudaGraphs."
                )
            if index > position:
                raise RuntimeError(
                    "CudaGraphs is listed before TorchCompile: graphs would capture eager code and compile "
                    "would trace the graph wrapper. Put TorchCompile before CudaGraphs in the callbacks list."
                )

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.enabled:
            return
        for optimizer in trainer.optimizers:
            if "capturable" in optimizer.defaults and not optimizer.defaults["capturable"]:
                raise RuntimeError(
                    f"CudaGraphs: {type(optimizer).__name__} was built with capturable=False. Build every "
                    "optimizer in configure_optimizers with `**self.optimizer_kwargs` (CudaGraphs sets "
                    "capturable=True there in setup)."
                )
        manual = not pl_module.automatic_optimization
        progress = manual_step_progress(trainer)
        if progress is None:  # a graphed step must count in trainer.global_step as Lightning's does
            notice_once(
                self, "CudaGraphs: this Lightning keeps its step count elsewhere; hot paths not graphed."
            )
            return

        def step_counter() -> int:
            return progress.total.completed if manual else 0

        def add_steps(n: int) -> None:
            progress.increment_by(n)

        for name in self._selected:

            def make(fn: Any, name: str = name) -> GraphedPath:
                graphed = GraphedPath(fn, name, self.warmup, pl_module.device, step_counter, add_steps)
                self._graphed[name] = graphed
                return graphed

            wrap_hot_path(pl_module, name, make, owner=self)

    @property
    def graphs_captured(self) -> int:
        """Graphs captured by this callback so far, over all paths and fits."""
        return self._captured_before + sum(g.graphs_captured for g in self._graphed.values())

    @property
    def graph_replays(self) -> int:
        """Hot-path calls answered by replaying a captured graph, over all paths and fits."""
        return self._replays_before + sum(g.graph_replays for g in self._graphed.values())

    def _restore(self, pl_module: pl.LightningModule) -> None:
        restore_hot_paths(pl_module, self)
        # Dropping the GraphedPath objects releases the graphs and their memory pools.
        self._captured_before = self.graphs_captured
        self._replays_before = self.graph_replays
        self._graphed.clear()
