"""The ``doctor`` and ``bench`` commands: the report's sections and advice, the bench's JSON and MLflow."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
from helpers.cli import TINY_TDMPC2, mlflow_client, mlflow_runs, run_main

from rl_lightning.cli import main
from rl_lightning.cli.doctor import recommendations

SECTIONS = ("device", "TF32", "torch.compile", "CPU", "libraries", "recommendations")


@pytest.mark.slow
def test_doctor_prints_every_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    for section in SECTIONS:
        assert section in lines, f"section {section!r} missing from:\n{out}"
    assert "CUDA available" in out and "torch_threads setting" in out
    assert "flush_denormal setting" in out and "true (this CPU can flush subnormal floats)" in out
    for library in (
        "torch",
        "lightning",
        "torchrl",
        "tensordict",
        "gymnasium",
        "hydra-core",
        "mlflow",
        "box2d",
    ):
        assert any(ln.strip().startswith(library + " ") for ln in lines), library
    # The compile probe ran (or says why not) and the advice is about this machine.
    compile_section = out.split("\ntorch.compile\n")[1].split("\nCPU\n")[0]
    works = next(ln for ln in compile_section.splitlines() if ln.strip().startswith("works"))
    verdict = works.split()[1].rstrip(":")
    assert verdict in ("yes", "no"), works
    # A working compiler is measured against eager; a broken one is reported with its reason.
    assert ("eager speed" in compile_section) == (verdict == "yes"), compile_section
    advice = out.split("recommendations")[-1]
    assert advice.strip().startswith("-")
    if not torch.cuda.is_available():
        assert "no CUDA" in advice


def test_doctor_can_skip_the_compile_probe(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "doctor.compile=false"]) == 0
    assert "skipped (doctor.compile=false)" in capsys.readouterr().out


def test_recommendations_follow_the_measurements() -> None:
    threads_ok = {"many_threads": 2.0, "many_s": 1e-3, "one_thread_s": 1e-3}
    threads_bad = {"many_threads": 2.0, "many_s": 5e-3, "one_thread_s": 1e-3}
    threads_many = {"many_threads": 8.0, "many_s": 1e-3, "one_thread_s": 4e-3}
    probe = {"act_compile_s": 1.0, "update_compile_s": 2.0, "act_eager_s": 1e-4, "act_compiled_s": 2e-4}
    slower = recommendations(False, {**probe, "update_eager_s": 1e-3, "update_compiled_s": 2e-3}, threads_ok)
    assert any("keep compile off" in line and "0.50x" in line for line in slower)
    faster = recommendations(False, {**probe, "update_eager_s": 2e-3, "update_compiled_s": 1e-3}, threads_ok)
    assert any("worth trying" in line and "2.00x" in line for line in faster)
    assert not any("torch_threads" in line for line in faster)
    assert any("keep torch_threads=1" in line for line in recommendations(False, None, threads_bad, 1))
    assert any("set torch_threads=1" in line for line in recommendations(False, None, threads_bad, None))
    assert any("torch_threads=null" in line for line in recommendations(False, None, threads_many, 1))
    broken = recommendations(False, {"error": "no C++ compiler"}, threads_ok)
    assert any("does not work" in line and "no C++ compiler" in line for line in broken)


@pytest.mark.parametrize(
    ("override", "message"),
    [("bench.variants=[nope]", "unknown ['nope']"), ("bench.frames=100", "bench.frames>=")],
)
def test_bench_rejects_bad_settings_in_one_line(override: str, message: str, capsys) -> None:
    assert main(["bench", "+experiment=dqn_cartpole", override]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: bench") and message in err and "\n" not in err


@pytest.mark.slow
def test_bench_writes_baseline_variants_and_ratios(tmp_path: Path) -> None:
    proc = run_main(
        tmp_path,
        "bench",
        "+experiment=dqn_cartpole",
        "device=cpu",
        "bench.frames=512",
        "collect.warmup_frames=128",
        "collect.frames_per_batch=128",
        "bench.variants=[fused_optimizer,tf32]",
        "bench.act_calls=20",
        "bench.out=out/bench.json",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "env frames/s" in proc.stdout and "fused_optimizer" in proc.stdout
    results = json.loads((tmp_path / "out" / "bench.json").read_text())
    (run_dir,) = tmp_path.glob("runs/dqn_cartpole/*/bench_results.json")
    assert json.loads(run_dir.read_text()) == results
    assert results["experiment"] == "dqn_cartpole" and results["frames"] == 512
    assert results["torch_threads"] == 1 and results["flush_denormal"] is True
    assert results["machine"]["libraries"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    rows = {row["variant"]: row for row in results["variants"]}
    assert list(rows) == ["baseline", "fused_optimizer", "tf32"]
    base, fused = rows["baseline"], rows["fused_optimizer"]
    assert base["status"] == "ok" and base["callbacks"] == []
    for key in ("env_fps", "updates_per_s", "act_ms", "peak_mem_mb"):
        assert base[key] > 0 and base["ratios"][key] == pytest.approx(1.0)
        assert fused[key] > 0 and fused["ratios"][key] == pytest.approx(fused[key] / base[key])
    assert fused["status"] == "ok" and fused["callbacks"] == ["fused_optimizer"]
    assert "FusedOptimizer" in fused["runs"][0]["callbacks"]
    # Steady state only: the window starts after the warm-up and one collection with the policy.
    assert base["runs"][0]["window"]["start_frame"] >= 128 + 128
    assert base["runs"][0]["window"]["frames"] >= 2 * 128
    if not torch.cuda.is_available():
        assert rows["tf32"]["status"] == "n/a (no CUDA)"
    (run,) = [r for r in mlflow_runs(tmp_path) if r.info.run_name == "dqn_cartpole-bench"]
    metrics = run.data.metrics
    assert metrics["bench/baseline/env_fps"] == pytest.approx(base["env_fps"])
    assert metrics["bench/fused_optimizer/updates_per_s_ratio"] == pytest.approx(
        fused["ratios"]["updates_per_s"]
    )
    artifacts = [a.path for a in mlflow_client(tmp_path).list_artifacts(run.info.run_id)]
    assert "bench_results.json" in artifacts


@pytest.mark.slow
def test_bench_times_act_on_as_many_envs_as_training_steps(tmp_path: Path) -> None:
    # TD-MPC2's planner is built for env.num_envs envs: the act latency must be timed on that many.
    proc = run_main(
        tmp_path, "bench", "+experiment=tdmpc2_pendulum", *TINY_TDMPC2, "device=cpu", "logger=none",
        "env.num_envs=2", "collect.warmup_frames=32", "bench.frames=96", "bench.variants=[fused_optimizer]",
        "bench.baseline=false", "bench.act_calls=3", "bench.out=out/bench.json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "bench.json").read_text())
    (row,) = results["variants"]
    assert row["variant"] == "fused_optimizer" and row["status"] == "ok" and row["act_ms"] > 0


def fake_run(out: Path, seen: list, cfg, callbacks, run_dir, index) -> dict:
    """A variant run that measures nothing, recording the results file as it stood before it."""
    if out.exists():
        seen.append(json.loads(out.read_text()))
    figures = {"env_fps": 100.0, "updates_per_s": 50.0, "act_ms": 0.1, "peak_mem_mb": 10.0}
    return {"status": "ok", "warmup_s": 1.0, "memory": "rss", **figures}


def test_bench_rewrites_its_results_after_every_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bench stopped between two variant runs leaves the rows it measured, marked incomplete."""
    import rl_lightning.cli.bench as bench_cli
    from rl_lightning.cli import compose

    out = tmp_path / "bench.json"
    seen: list[dict] = []

    monkeypatch.setattr(bench_cli, "run_once", partial(fake_run, out, seen))
    cfg = compose(["+experiment=dqn_cartpole", "device=cpu", "logger=none", f"run_dir={tmp_path / 'run'}",
                   "bench.variants=[fused_optimizer,direct_steps]", f"bench.out={out}"])  # fmt: skip
    results = bench_cli.bench(cfg)
    # Before the second and third runs: the baseline, then the baseline and fused_optimizer, measured.
    assert [[(r["variant"], r["status"]) for r in s["variants"]] for s in seen] == [
        [("baseline", "ok"), ("fused_optimizer", "not run yet"), ("direct_steps", "not run yet")],
        [("baseline", "ok"), ("fused_optimizer", "ok"), ("direct_steps", "not run yet")],
    ]
    assert [s["complete"] for s in seen] == [False, False]
    assert results["complete"] and json.loads(out.read_text()) == results


def test_bench_without_baseline_runs_only_the_variants(tmp_path: Path, monkeypatch) -> None:
    """``bench.baseline=false``: no reference run, and no ratios to one (not ratios to the first variant)."""
    import rl_lightning.cli.bench as bench_cli
    from rl_lightning.cli import compose

    runs: list = []

    def run_once(cfg, callbacks, run_dir, index) -> dict:
        runs.append(callbacks)
        return fake_run(tmp_path / "x", [], cfg, callbacks, run_dir, index)

    monkeypatch.setattr(bench_cli, "run_once", run_once)
    cfg = compose(["+experiment=dqn_cartpole", "device=cpu", "logger=none", f"run_dir={tmp_path / 'run'}",
                   "bench.variants=[fused_optimizer,direct_steps]", "bench.baseline=false"])  # fmt: skip
    results = bench_cli.bench(cfg)
    assert [r["variant"] for r in results["variants"]] == ["fused_optimizer", "direct_steps"]
    assert len(runs) == 2 and all(runs)  # each run with its callbacks, none without
    assert all("ratios" not in r and r["env_fps"] == 100.0 for r in results["variants"])
    assert results["baseline_spread"] is None
