"""``benchmarks/tdmpc2_plan_latency.py``, which the GPU suite's plan steps run, gives on a CPU the row the
suite reads."""

from __future__ import annotations


def test_the_eager_plan_gives_a_row_of_its_latency(load_benchmark) -> None:
    bench = load_benchmark("tdmpc2_plan_latency")
    row = bench.latency("1M", "cpu", num_envs=1, calls=2, warmup=1)
    assert "error" not in row, row.get("error")
    assert (row["variant"], row["compile_mode"], row["compile_s"]) == ("eager", None, None)
    assert row["calls"] == 2 and 0 < row["ms_min"] <= row["ms_median"]
    assert row["planner"]["iterations"] == 6 and row["planner"]["num_samples"] == 512  # the paper's planner
