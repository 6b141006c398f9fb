"""CudaGraphs' capture/replay bookkeeping, run on CPU against a simulated CUDA graph API.

The simulation keeps the one property that matters: work "launched" while a graph is being captured is
recorded, not run, and ``replay()`` runs the recorded work again on the same buffers without any Python of
the captured function. Real capture is covered by the ``gpu`` tests.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from tensordict import TensorDict

from callbacks import _graphed_path
from callbacks._graphed_path import GraphedPath


class FakeGraph:
    recording: FakeGraph | None = None

    def __init__(self) -> None:
        self.work: list = []

    def replay(self) -> None:
        for work in self.work:
            work()


class FakeStream:
    def wait_stream(self, other) -> None:
        pass


@contextlib.contextmanager
def fake_capture(graph: FakeGraph, **kwargs):
    FakeGraph.recording = graph
    try:
        yield
    finally:
        FakeGraph.recording = None


def launch(work) -> None:
    """A kernel launch: recorded during capture, run now otherwise."""
    if FakeGraph.recording is not None:
        FakeGraph.recording.work.append(work)
    else:
        work()


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch):
    cuda = _graphed_path.torch.cuda
    monkeypatch.setattr(cuda, "Stream", lambda device=None: FakeStream())
    monkeypatch.setattr(cuda, "current_stream", lambda device=None: FakeStream())
    monkeypatch.setattr(cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(cuda, "graph", fake_capture)


class Update:
    """A stand-in for ``update``: doubles the input into a new buffer and takes one 'optimizer step'."""

    def __init__(self) -> None:
        self.python_calls = 0
        self.steps = 0
        self.inner = None

    def __call__(self, td: TensorDict) -> TensorDict:
        self.python_calls += 1
        self.steps += 1  # Lightning's optimizer-step counter advances in Python
        if self.inner is not None:
            self.inner(td)
        out = torch.empty_like(td["x"])
        x = td["x"]
        launch(lambda: out.copy_(x * 2))
        # An output written under an input key: the graph must keep reading the original input buffer.
        td["x"] = out
        return TensorDict(y=out, batch_size=td.batch_size)


def make(fn, warmup: int = 2, max_graphs: int = 8) -> GraphedPath:
    def add_steps(n: int) -> None:
        fn.steps += n

    return GraphedPath(fn, "update", warmup, torch.device("cpu"), lambda: fn.steps, add_steps, max_graphs)


def batch(value: float, n: int = 3) -> TensorDict:
    return TensorDict(x=torch.full((n,), value), batch_size=[n])


def test_warmup_capture_replay_results_and_python_calls(fake_cuda) -> None:
    fn = Update()
    graphed = make(fn, warmup=2)
    for i in range(6):
        out = graphed(batch(float(i)))
        assert torch.equal(out["y"], torch.full((3,), 2.0 * i)), f"call {i}"
    # Two warm-up calls and one capture run Python; the three replays do not.
    assert fn.python_calls == 3
    assert graphed.graphs_captured == 1 and graphed.graph_replays == 3
    # Every call took one step, replays included: the counter matches an eager run.
    assert fn.steps == 6


def test_outputs_are_not_overwritten_by_later_replays(fake_cuda) -> None:
    graphed = make(Update(), warmup=1)
    outs = [graphed(batch(float(i))) for i in range(4)]
    assert [o["y"][0].item() for o in outs] == [0.0, 2.0, 4.0, 6.0]


def test_each_input_signature_gets_its_own_graph(fake_cuda) -> None:
    fn = Update()
    graphed = make(fn, warmup=1, max_graphs=2)
    for i in range(3):
        assert graphed(batch(float(i), n=3))["y"].shape == (3,)
        assert graphed(batch(float(i), n=5))["y"][0] == 2.0 * i
    assert graphed.graphs_captured == 2
    graphed(batch(1.0, n=7))  # past max_graphs: runs eagerly
    assert graphed.eager_fallbacks == 1 and graphed.graphs_captured == 2


def test_nested_graphed_path_runs_inline(fake_cuda) -> None:
    inner_fn = Update()
    inner = make(inner_fn, warmup=1)
    outer_fn = Update()
    outer_fn.inner = inner
    outer = make(outer_fn, warmup=1)
    for i in range(3):
        outer(batch(float(i)))
    assert inner.graphs_captured == 0  # called only from inside the outer path: part of its graph
    assert outer.graphs_captured == 1


def test_outputs_requiring_grad_are_refused(fake_cuda) -> None:
    weight = torch.ones(3, requires_grad=True)

    def leaky(td: TensorDict) -> TensorDict:
        return TensorDict(y=td["x"] * weight, batch_size=td.batch_size)

    graphed = GraphedPath(leaky, "act", 1, torch.device("cpu"), lambda: 0, lambda n: None)
    graphed(batch(1.0))
    with pytest.raises(RuntimeError, match="require grad"):
        graphed(batch(1.0))


def test_capture_failure_explains_the_usual_causes(fake_cuda) -> None:
    def syncing(td: TensorDict) -> TensorDict:
        if FakeGraph.recording is not None:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        return td

    graphed = GraphedPath(syncing, "act", 1, torch.device("cpu"), lambda: 0, lambda n: None)
    graphed(batch(1.0))
    with pytest.raises(RuntimeError, match=r"(?s)capturing hot path 'act' failed.*\.item\(\)"):
        graphed(batch(1.0))


def test_writes_into_the_input_reach_the_caller(fake_cuda) -> None:
    def act(td: TensorDict) -> TensorDict:
        obs = td["x"]
        action = torch.empty_like(obs)
        launch(lambda: action.copy_(obs + 1))
        td["action"] = action  # written into the input and the input returned, as a policy does
        return td

    graphed = GraphedPath(act, "act", 1, torch.device("cpu"), lambda: 0, lambda n: None)
    for i in range(4):
        td = batch(float(i))
        out = graphed(td)
        assert out is td, f"call {i}: the caller's TensorDict comes back"
        assert torch.equal(td["action"], torch.full((3,), i + 1.0)), f"call {i}"
    kept = [graphed(batch(float(i))) for i in (10, 20)]
    assert [k["action"][0].item() for k in kept] == [11.0, 21.0]  # copies, not the static buffer
