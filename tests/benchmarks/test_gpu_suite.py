"""The GPU suite's summary: the tracked figures and their goals from the benches' rows, failures counted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def suite(load_benchmark):
    return load_benchmark("gpu_suite")


def bench(**variants: dict) -> dict:
    rows = [{"variant": name, "status": "ok", "runs": [], **row} for name, row in variants.items()]
    return {"variants": rows}


def test_figures_and_goals_on_cuda(suite) -> None:
    benches = {
        "tdmpc2": bench(
            baseline={"act_ms": 12.0, "env_fps": 90.0, "peak_mem_mb": 500.0},
            compile={"act_ms": 6.0},
            cuda_graphs={"act_ms": 3.0},
            fast={"act_ms": 1.2, "env_fps": 320.0, "peak_mem_mb": 700.0},
        ),
        "tdmpc2_8envs": bench(
            baseline={"act_ms": 14.0, "env_fps": 100.0}, fast={"act_ms": 1.6, "env_fps": 280.0}
        ),
        "sac": bench(baseline={"updates_per_s": 200.0}, fast={"updates_per_s": 500.0}),
    }
    figures = suite.tracked_figures(benches, cuda=True)
    assert figures["tdmpc2_plan_ms"] == {"eager": 12.0, "compiled": 6.0, "cuda_graphed": 3.0,
                                         "compiled_and_graphed": 1.2}  # fmt: skip
    assert figures["tdmpc2_plan_graphed_speedup"] == pytest.approx(10.0)
    assert figures["tdmpc2_plan_cuda_graphs_speedup"] == pytest.approx(4.0)
    assert figures["tdmpc2_hockey_fast_env_fps"] == 320.0
    # The 8-env bench's rows give its own figures, not the one-env ones.
    assert figures["tdmpc2_hockey_fast_env_fps_8_envs"] == 280.0
    assert figures["tdmpc2_plan_ms_8_envs"] == {"eager": 14.0, "compiled_and_graphed": 1.6}
    assert figures["sac_fast_updates_speedup"] == pytest.approx(2.5)
    assert figures["goals_met"] == {
        "tdmpc2_plan_graphed_speedup": True,  # 10x >= 5x
        "tdmpc2_plan_graphed_ms": True,  # 1.2 ms <= 1.5 ms
        "tdmpc2_hockey_fast_env_fps": True,  # 320 >= 300
        "tdmpc2_hockey_fast_env_fps_8_envs": False,  # 280 < 300
        "sac_fast_updates_speedup": False,  # 2.5x < 3x
    }
    assert figures["peak_mem_mb"]["tdmpc2"] == {"baseline": 500.0, "compile": None, "cuda_graphs": None,
                                                "fast": 700.0}  # fmt: skip


def test_without_cuda_the_gpu_figures_say_so(suite) -> None:
    figures = suite.tracked_figures({"tdmpc2": bench(baseline={"act_ms": 90.0})}, cuda=False)
    assert figures["tdmpc2_plan_ms"]["eager"] == 90.0
    assert figures["tdmpc2_plan_graphed_speedup"] == "n/a (no CUDA)"
    assert set(figures["goals_met"].values()) == {None}


def test_on_cuda_a_variant_not_run_reads_not_measured(suite) -> None:
    benches = {"tdmpc2": bench(baseline={"act_ms": 12.0}, cuda_graphs={"act_ms": 3.0})}
    figures = suite.tracked_figures(benches, cuda=True)
    assert figures["tdmpc2_plan_cuda_graphs_speedup"] == pytest.approx(4.0)
    assert figures["tdmpc2_plan_graphed_speedup"] == "not measured"
    assert figures["goals_met"]["tdmpc2_plan_graphed_speedup"] is None


def test_pytest_summary_counts(suite) -> None:
    assert suite.pytest_counts("1 failed, 30 passed, 4 skipped, 749 deselected in 80.1s") == {
        "failed": 1, "passed": 30, "skipped": 4, "deselected": 749,
    }  # fmt: skip


def test_on_cuda_the_tracked_variants_run_first_then_the_rest_of_the_ablation(suite) -> None:
    plan = suite.bench_plan(list(suite.BENCHES), None, cuda=True)
    assert plan[:2] == [("tdmpc2", ["fast"], False), ("sac", ["fast"], False)]
    # The 8-env bench is tracked but optional (the budget may leave it out), so it runs after the required
    # ones; it has no ablation of its own.
    assert plan[2] == ("tdmpc2_8envs", ["fast"], True)
    # The ablations are optional, cheapest first; each leaves out what its tracked bench ran.
    assert [(a, optional) for a, _, optional in plan[3:]] == [("dqn", True), ("sac", True), ("tdmpc2", True)]
    assert plan[3][1] == suite.ABLATION
    assert set(plan[4][1]) | {"fast"} == set(suite.ABLATION) and "fast" not in plan[4][1]
    assert "fast" not in plan[5][1] and {"cuda_graphs", "compile"} <= set(plan[5][1])
    assert suite.bench_plan(["dqn"], ["tf32"], cuda=True) == [("dqn", ["tf32"], False)]
    # Asked for by name with its variants, the 8-env bench is required like any other.
    assert suite.bench_plan(["tdmpc2_8envs"], ["fast"], cuda=True) == [("tdmpc2_8envs", ["fast"], False)]
    assert suite.bench_plan(["dqn"], None, cuda=False) == [("dqn", suite.CPU_VARIANTS, False)]


TIMED_OUT = "timed out after 90 s"


def test_only_an_optional_bench_may_be_stopped_by_the_budget(suite) -> None:
    rows = {"baseline": {"status": "ok"}, "tf32": {"status": "ok"}, "compile": {"status": "not run yet"}}
    assert suite.bench_verdict(TIMED_OUT, rows, optional=True, budget_spent=True) == (
        "stopped by --budget", []
    )  # fmt: skip
    # The same stop of a bench the tracked figures need, or before the budget is spent, is a failure.
    assert suite.bench_verdict(TIMED_OUT, rows, optional=False, budget_spent=True)[1] == ["compile"]
    assert suite.bench_verdict(TIMED_OUT, rows, optional=True, budget_spent=False)[1] == ["compile"]
    # A variant that failed or hit bench.timeout_s fails even an optional bench.
    rows["tf32"] = {"status": "failed: timed out after bench.timeout_s=240 s"}
    assert suite.bench_verdict(TIMED_OUT, rows, optional=True, budget_spent=True)[1] == ["tf32"]


def test_an_ablation_fills_in_the_variants_the_tracked_bench_did_not_run(suite) -> None:
    benches: dict = {}
    suite.merge_rows(benches, "tdmpc2", bench(baseline={"act_ms": 12.0}, fast={"act_ms": 1.2}))
    suite.merge_rows(benches, "tdmpc2", bench(baseline={"act_ms": 13.0}, compile={"act_ms": 6.0}))
    rows = {row["variant"]: row["act_ms"] for row in benches["tdmpc2"]["variants"]}
    assert rows == {"baseline": 12.0, "fast": 1.2, "compile": 6.0}
    assert suite.tracked_figures(benches, cuda=True)["tdmpc2_plan_ms"]["compiled"] == 6.0


@pytest.mark.parametrize("args", [[], ["DIR"]])
def test_offline_runner_refuses_in_one_line_without_a_folder_or_wheels(args, tmp_path: Path) -> None:
    # A copy of the script in a tree without .whl/: no folder given, or no wheels to install.
    (tmp_path / "benchmarks").mkdir()
    script = tmp_path / "benchmarks" / "gpu_offline.sh"
    script.write_text((BENCHMARKS / "gpu_offline.sh").read_text())
    cmd = ["bash", str(script), *[str(tmp_path / a) for a in args]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("gpu_offline: ") and ("DIR" in line if not args else ".whl/" in line)


def test_the_parts_step_reads_fit_parts_ms_per_frame(suite, tmp_path: Path, monkeypatch) -> None:
    results = tmp_path / "results"
    results.mkdir()
    monkeypatch.setattr(suite, "RESULTS", results)
    calls = []

    def run_step(name, cmd, timeout_s, env, log):
        calls.append(cmd)
        parts = {"act": {"us_per_frame": 2210.0}, "update": {"seconds": 1.0}}  # no per-frame figure: left out
        (results / "fit_parts_tdmpc2_hockey.json").write_text(suite.json.dumps({"parts": parts}))
        return {"command": " ".join(cmd), "status": "ok"}

    monkeypatch.setattr(suite, "run_step", run_step)
    steps, failed = {}, []
    suite.parts_step(steps, tmp_path, {}, 200.0, failed)
    assert steps["tdmpc2_parts"]["ms_per_frame"] == {"act": 2.21}
    assert failed == []
    assert "--sync" in calls[0] and "callbacks=fast" in calls[0] and "device=cuda" in calls[0]

    # Too little budget: not run and not a failure; a run that leaves no results: a failure.
    suite.parts_step(steps, tmp_path, {}, 100.0, failed)
    assert steps["tdmpc2_parts"]["status"] == "not run: --budget spent" and failed == []
    monkeypatch.setattr(suite, "run_step", lambda *a: {"command": "", "status": "ok"})
    suite.parts_step(steps, tmp_path, {}, 200.0, failed)
    assert steps["tdmpc2_parts"]["status"] == "failed: no results" and len(failed) == 1


def test_profile_summary_per_variant_without_warm_up(suite, tmp_path) -> None:
    """``--profile``'s summary of py-spy's raw stacks: one entry per bench variant process (named from its
    spec's folder), stacks under compilation or imports counted apart, and each function's share of the
    other samples as the innermost frame and anywhere in the stack."""
    # Each sample names its process and the process's parents, outermost first (py-spy's raw format).
    code = "from rl_lightning.cli.bench.timing import worker_main; worker_main()"
    spec = f"{suite.ROOT}/runs/gpu_suite/tdmpc2/variants/fast/spec0.json"
    fast = f'process 7:"";process 41:"python -c {code} {spec}"'
    site = "/tmp/site/torchrl/data/replay_buffers/samplers/slice.py"
    module = f"{suite.ROOT}/rl_lightning/algos/tdmpc2/module.py"
    raw = tmp_path / "spy.txt"
    raw.write_text(
        f"{fast};fit (rl_lightning/cli/run.py:10);sample ({site}:887);_sample_slices ({site}:1035) 6\n"
        f"{fast};fit (rl_lightning/cli/run.py:10);sample ({site}:887) 2\n"
        f"{fast};fit (rl_lightning/cli/run.py:10);update ({module}:265) 2\n"
        f"{fast};fit (rl_lightning/cli/run.py:10);compile_fx (/tmp/site/torch/_inductor/compile_fx.py:3) 90\n"
        f"{fast} 3\n"  # no Python frame (native code)
        'process 7:"";main (rl_lightning/cli/bench/__init__.py:97) 1\n'
    )
    summary = suite.spy_summary(raw, top=2)
    assert list(summary) == ["fast", "(command line not read)"]
    fast_summary = summary["fast"]
    assert (fast_summary["samples"], fast_summary["warmup_samples"]) == (13, 90)
    slices = "torchrl/data/replay_buffers/samplers/slice.py"
    assert fast_summary["self"] == [[f"_sample_slices ({slices})", 0.4615], ["(no Python frame) ()", 0.2308]]
    assert fast_summary["total"] == [
        ["fit (rl_lightning/cli/run.py)", 0.7692],
        [f"sample ({slices})", 0.6154],
    ]
    assert ["update (rl_lightning/algos/tdmpc2/module.py)", 0.1538] in suite.spy_summary(raw)["fast"]["self"]


def test_the_default_schedule_keeps_its_order(suite) -> None:
    algos = list(suite.DEFAULT_ALGOS)
    steps = suite.schedule(algos, None, cuda=True, skip_tests=False, budgeted=False)
    assert steps[0] == ("tests",)
    kinds = [s[0] for s in steps]
    # The parts step comes after the required benches and before the first optional one.
    first_optional = next(i for i, s in enumerate(steps) if s[0] == "bench" and s[3])
    assert kinds.index("parts") == first_optional - 1
    assert all(not s[3] for s in steps[: kinds.index("parts")] if s[0] == "bench")
    assert suite.schedule(["dqn"], None, cuda=False, skip_tests=True, budgeted=False) == [
        ("bench", "dqn", suite.CPU_VARIANTS, False)
    ]  # fmt: skip


def test_the_budgeted_schedule_puts_tests_then_the_open_figures_first(suite) -> None:
    steps = suite.schedule(list(suite.BENCHES), None, cuda=True, skip_tests=False, budgeted=True)
    assert steps[:3] == [
        ("tests",),
        ("bench", "tdmpc2_8envs", ["fast"], True, ["bench.baseline=false"]),  # its eager figure is known
        ("plan", "plan_autotune"),
    ]
    assert all(s[3] for s in steps if s[0] == "bench")  # the budget may leave any bench out
    only_sac = suite.schedule(["sac"], None, cuda=True, skip_tests=True, budgeted=True)
    assert ("tests",) not in only_sac and [s[1] for s in only_sac if s[0] == "bench"] == ["sac"]


def test_plan_candidates_give_the_plan_figures_without_the_bench(suite) -> None:
    rows = [
        {"variant": "eager", "compile_mode": None, "ms_median": 30.0},
        {"variant": "compiled_graphs", "compile_mode": "default", "ms_median": 2.0,
         "kernels_per_plan": 400.0, "kernel_ms_per_plan": 1.7},
        {"variant": "compiled_graphs", "compile_mode": "max-autotune-no-cudagraphs", "ms_median": 1.4,
         "compile_s": 90.0},
    ]  # fmt: skip
    figures = suite.tracked_figures({}, cuda=True, plans=rows)
    assert figures["tdmpc2_plan_candidates"]["compiled_graphs max-autotune-no-cudagraphs"] == {
        "ms_median": 1.4, "compile_s": 90.0
    }  # fmt: skip
    assert figures["tdmpc2_plan_graphed_ms"] == 2.0  # compile's default mode, as fast runs it
    assert figures["tdmpc2_plan_graphed_speedup"] == pytest.approx(15.0)
    assert figures["tdmpc2_plan_from_latency_benchmark"] == ["baseline", "fast"]
    # A variant that failed keeps its error and gives no figure.
    failed = [rows[0], {"variant": "compiled_graphs", "compile_mode": "default", "error": "RuntimeError()"}]
    figures = suite.tracked_figures({}, cuda=True, plans=failed)
    assert figures["tdmpc2_plan_candidates"]["compiled_graphs default"] == {"error": "RuntimeError()"}
    assert figures["tdmpc2_plan_graphed_ms"] == "not measured"
    # The bench's own figure wins where it ran.
    benches = {"tdmpc2": bench(baseline={"act_ms": 40.0}, fast={"act_ms": 2.2})}
    assert suite.tracked_figures(benches, cuda=True, plans=rows)["tdmpc2_plan_graphed_ms"] == 2.2


def test_a_stopped_script_step_keeps_the_rows_it_printed(suite, tmp_path: Path, monkeypatch) -> None:
    def run_step(name, cmd, timeout_s, env, log):
        log.write_text('compiling\n{"variant": "eager", "ms_median": 30.0}\n{"trunc')
        return {"command": " ".join(cmd), "status": f"timed out after {timeout_s:.0f} s"}

    monkeypatch.setattr(suite, "run_step", run_step)
    steps, failed = {}, []
    suite.script_step(steps, "plan_autotune", ["x.py"], tmp_path, {}, 100.0, failed, 60.0, optional=True)
    assert steps["plan_autotune"]["results"] == [{"variant": "eager", "ms_median": 30.0}]
    assert steps["plan_autotune"]["status"].startswith("stopped by --budget") and failed == []
    suite.script_step(steps, "plan_default", ["x.py"], tmp_path, {}, 100.0, failed, 60.0)
    assert failed == ["plan_default: timed out after 100 s"]
    suite.script_step(steps, "plan_default", ["x.py"], tmp_path, {}, 30.0, failed, 60.0)
    assert steps["plan_default"]["status"] == "not run: --budget spent" and len(failed) == 1


def test_budgeted_run_measures_by_priority_until_the_budget_is_spent(suite, tmp_path, monkeypatch) -> None:
    """``--budgeted`` on a (faked) GPU: the steps run in ``BUDGETED``'s order, each starting only with its
    minimum time left; those the budget leaves out are reported as not run and fail nothing, and the JSON
    is written into ``--out-dir`` after every step."""
    clock = [0.0]
    ran, commands = [], {}

    def run_step(name, cmd, timeout_s, env, log):
        ran.append(name)
        commands[name] = cmd
        clock[0] += {"pytest -m gpu": 150, "plan_autotune": 110}.get(name, 200)
        log.write_text("")
        return {"command": " ".join(cmd), "status": "ok", "output_tail": "44 passed in 150.0s"}

    monkeypatch.setattr(suite, "run_step", run_step)
    monkeypatch.setattr(suite.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(suite.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(suite.torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(suite, "machine", lambda: {"cpu": "test"})
    monkeypatch.setattr(suite, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["gpu_suite.py", "--budgeted", "--out-dir", str(tmp_path / "out")])
    assert suite.main() == 1  # the faked steps write no results: the ones that ran say so
    result = json.loads((tmp_path / "out" / "gpu_suite_nvidia_h100_80gb_hbm3.json").read_text())
    # 480 s: the tests (150), the 8-env bench (200), the autotuned plan (110); 20 s left start nothing.
    assert ran == ["pytest -m gpu", "bench tdmpc2_8envs", "plan_autotune"]
    assert "bench.baseline=false" in commands["bench tdmpc2_8envs"]
    assert result["budget_s"] == 480.0 and result["device_name"] == "NVIDIA H100 80GB HBM3"
    not_run = [k for k, s in result["steps"].items() if s["status"] == "not run: --budget spent"]
    assert not_run == [
        "bench_sac_host_replay", "bench_dqn_host_replay", "bench_dqn_atari", "plan_default", "bench_tdmpc2",
        "tdmpc2_parts", "bench_sac",
    ]  # fmt: skip
    assert not any(k in " ".join(result["failed"]) for k in ("plan_default", "parts", "sac"))
