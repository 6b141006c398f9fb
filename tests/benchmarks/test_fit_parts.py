"""``benchmarks/fit_parts.py --ops``: operations that do work and host reads, counted per part."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def fit_parts(load_benchmark):
    module = load_benchmark("fit_parts")  # fresh: the tests change its counters and state
    module.STATE.update(ops=True, counting=True)
    return module


def test_ops_are_counted_in_every_part_a_call_is_inside_of_views_left_out(fit_parts) -> None:
    x = torch.arange(6.0)
    with fit_parts._Inside("outer"):
        y = x.view(2, 3).t().unsqueeze(0).detach()  # views and an alias: no work
        z = y + 1
        with fit_parts._Inside("inner"):
            (z > 2).nonzero()  # a comparison and a host read
            float(z.sum())  # a reduction and a host read (.item())
    assert fit_parts.OPS["inner"] == {"ops": 4, "host_reads": 2}
    assert fit_parts.OPS["outer"] == {"ops": 5, "host_reads": 2}
    assert fit_parts.ACTIVE == []
    # Outside every part the counter is off: nothing more is counted.
    x + 1
    assert fit_parts.OPS["outer"]["ops"] == 5


def test_nothing_is_counted_before_counting_begins(fit_parts) -> None:
    fit_parts.STATE["counting"] = False  # --from-frames not reached yet
    with fit_parts._Inside("update"):
        torch.ones(3).sum()
    assert "update" not in fit_parts.OPS
