"""Shared test setup: GPU tests are skipped without CUDA."""

import pytest
import torch

# Small tensors: one thread is fastest, and it keeps parallel test processes from oversubscribing the cores.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
