"""Shared test setup: GPU tests are skipped without CUDA; benchmark scripts load as modules; the asserts of
the shared helpers (``tests/helpers/``) report their operands as a test module's do."""

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
import torch

# Before any test module imports them: pytest rewrites the asserts of test modules only.
pytest.register_assert_rewrite("helpers")

# Small tensors: one thread is fastest, and it keeps parallel test processes from oversubscribing the cores.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a fresh module. The scripts are not a package: while one loads, its folder
    is on ``sys.path`` so that its own imports (``_common``) resolve."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="session")
def load_benchmark() -> Callable[[str], ModuleType]:
    """Loads a benchmark script by name (``load_benchmark("gpu_suite")``), a fresh module each call."""
    return _load_benchmark
