"""Capture and replay of one hot path as CUDA graphs, one graph per input signature.

Written on ``torch.cuda.graphs`` directly rather than on ``tensordict.nn.CudaGraphModule`` because the
latter synchronizes the device before every replay (a host sync per update) and runs the function twice on
the capture call (eagerly, then under capture), which would count Lightning's optimizer steps twice.
Here the capture call records the graph and then replays it once: Python side effects run exactly once per
call until capture, the device work exactly once per call always.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDictBase

_NESTING = threading.local()


def _nesting_depth() -> int:
    return getattr(_NESTING, "depth", 0)


def _signature(td: TensorDictBase) -> tuple:
    leaves = td.items(include_nested=True, leaves_only=True)
    return tuple(
        (key, tuple(value.shape), value.dtype, value.device)
        if isinstance(value, torch.Tensor)
        else (key, type(value))
        for key, value in leaves
    )


@dataclass
class _Entry:
    calls: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    static_in: TensorDictBase | None = None
    graph_inputs: TensorDictBase | None = None
    static_out: Any = None
    steps_per_call: int = 0
    written: list = field(default_factory=list)
    out_is_input: bool = False
    warmup_stream: torch.cuda.Stream | None = field(default=None, repr=False)


class GraphedPath:
    """Callable that runs ``fn(td)`` eagerly ``warmup`` times per input signature, then as a CUDA graph.

    Args:
        fn: the hot path, ``TensorDict -> TensorDict`` with detached outputs.
        name: the path's name, for messages.
        warmup: eager calls (on a side stream) before capture.
        device: the CUDA device the graph runs on; inputs elsewhere are copied there first.
        step_counter: returns Lightning's optimizer-step count; ``add_steps(n)`` advances it. A replay runs
            no Python, so the steps the path took on its capture call are added back after every replay.
        max_graphs: signatures to capture; calls with further signatures run eagerly.
    """

    def __init__(
        self,
        fn: Callable[[TensorDictBase], Any],
        name: str,
        warmup: int,
        device: torch.device,
        step_counter: Callable[[], int],
        add_steps: Callable[[int], None],
        max_graphs: int = 8,
    ) -> None:
        self.fn = fn
        self.name = name
        self.warmup = warmup
        self.device = device
        self.step_counter = step_counter
        self.add_steps = add_steps
        self.max_graphs = max_graphs
        self.entries: dict[tuple, _Entry] = {}
        self.graphs_captured = 0
        #: Calls answered by replaying a captured graph (the capture's own replay not counted).
        self.graph_replays = 0
        self.eager_fallbacks = 0

    def __call__(self, td: TensorDictBase, *args: Any, **kwargs: Any) -> Any:
        # A graphed path called from inside another one (act inside update) becomes part of the outer graph.
        if _nesting_depth() > 0 or args or kwargs or not isinstance(td, TensorDictBase):
            return self.fn(td, *args, **kwargs)
        key = (_signature(td), torch.is_grad_enabled(), torch.is_inference_mode_enabled())
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= self.max_graphs:
                self.eager_fallbacks += 1
                return self.fn(td)
            entry = self.entries[key] = _Entry(warmup_stream=torch.cuda.Stream(self.device))
        _NESTING.depth = _nesting_depth() + 1
        try:
            if entry.graph is not None:
                return self._replay(entry, td)
            if entry.calls < self.warmup:
                return self._warmup(entry, td)
            return self._capture(entry, td)
        finally:
            _NESTING.depth -= 1

    def _warmup(self, entry: _Entry, td: TensorDictBase) -> Any:
        moved = td.to(self.device, non_blocking=True)
        ids = _leaves(moved)
        stream = entry.warmup_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            out = self.fn(moved)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        entry.calls += 1
        if moved is td:
            return out
        # The input was copied to the device: mirror what the path wrote into the copy.
        for key in _written_keys(moved, ids):
            td.set(key, moved.get(key))
        return td if out is moved else out

    def _capture(self, entry: _Entry, td: TensorDictBase) -> Any:
        entry.static_in = td.to(self.device, non_blocking=True).clone()
        # The buffers the graph reads, held apart from ``static_in``: the path may rebind entries of its
        # input to new tensors while captured (an output written under an input key).
        entry.graph_inputs = entry.static_in.clone(recurse=False)
        ids = _leaves(entry.static_in)
        graph = torch.cuda.CUDAGraph()
        steps_before = self.step_counter()
        try:
            with torch.cuda.graph(graph):
                entry.static_out = self.fn(entry.static_in)
        except RuntimeError as err:
            raise RuntimeError(
                f"CudaGraphs: capturing hot path '{self.name}' failed: {err}\nA captured path must not sync "
                "with the host (.item(), printing a tensor, Python branches on tensor values, a CPU tensor "
                "moved to the GPU inside it) nor be watched by such hooks (gradient-norm logging). Fix the "
                "path, or drop it from `cuda_graph_safe` / from CudaGraphs(paths=...)."
            ) from err
        _check_detached(entry.static_out, self.name)
        entry.written = _written_keys(entry.static_in, ids)
        entry.out_is_input = entry.static_out is entry.static_in
        entry.steps_per_call = self.step_counter() - steps_before
        entry.graph = graph
        entry.calls += 1
        self.graphs_captured += 1
        # Capture records the work without running it: replay once for this call's result.
        graph.replay()
        return self._result(entry, td)

    def _replay(self, entry: _Entry, td: TensorDictBase) -> Any:
        # Same stream as the replay: no host sync needed; a pageable CPU source is staged before returning.
        entry.graph_inputs.update_(td, non_blocking=True)
        entry.graph.replay()
        if entry.steps_per_call:
            self.add_steps(entry.steps_per_call)
        entry.calls += 1
        self.graph_replays += 1
        return self._result(entry, td)

    @staticmethod
    def _result(entry: _Entry, td: TensorDictBase) -> Any:
        # Keep the eager contract: keys the path writes into its input (act's "action", a loss's
        # "td_error" read back for priorities) show up in the caller's TensorDict. Everything handed out
        # is a copy: the next replay overwrites the static buffers.
        for key in entry.written:
            td.set(key, entry.static_in.get(key).clone())
        return td if entry.out_is_input else _clone(entry.static_out)


def _leaves(td: TensorDictBase) -> dict:
    # The leaves themselves, not their ids: holding them keeps an id from being reused by a new tensor.
    return dict(td.items(True, True))


def _written_keys(td: TensorDictBase, before: dict) -> list:
    """Keys of ``td`` that are new or bound to another tensor than in ``before``."""
    return [key for key, value in td.items(True, True) if before.get(key) is not value]


def _clone(out: Any) -> Any:
    if isinstance(out, TensorDictBase | torch.Tensor):
        return out.clone()
    return out


def _check_detached(out: Any, name: str) -> None:
    leaves = (
        list(out.values(include_nested=True, leaves_only=True)) if isinstance(out, TensorDictBase) else [out]
    )
    if any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
        raise RuntimeError(
            f"CudaGraphs: hot path '{name}' returned tensors that require grad; a replayed graph cannot "
            "extend the autograd graph. Return detached tensors (detach metrics, act under torch.no_grad())."
        )
