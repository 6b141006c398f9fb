"""`plot`: curves found in benchmark results and MLflow, aligned over seeds, drawn to an image."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rl_lightning.cli import main
from rl_lightning.cli.plot import _aligned, curves_from_json, default_label, frames_label, grid

pytest.importorskip("matplotlib")


def test_curves_are_found_per_seed_and_aligned_on_the_union_of_frames(tmp_path: Path) -> None:
    result = {
        "seeds": [
            {"seed": 0, "eval_curve": [[100, 1.0], [300, 3.0]], "wall_s": 5},
            {"seed": 1, "eval_curve": [[200, 10.0], [300, 30.0]]},
        ],
        "curves": {"eval/win_rate": [[50, 0.5]]},
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    curves = curves_from_json(path)
    assert sorted(curves) == ["eval/win_rate", "eval_curve"]
    assert [c[0] for c in curves["eval_curve"]] == ["seed 0", "seed 1"]
    frames, values = _aligned(curves["eval_curve"])
    assert frames.tolist() == [100, 200, 300]
    # Each seed holds its last value between its points, and has none before its first.
    np.testing.assert_array_equal(values, [[1.0, 1.0, 3.0], [np.nan, 10.0, 30.0]])


def test_seeds_keyed_by_their_number_are_the_seeds_of_one_curve(tmp_path: Path) -> None:
    """The learning runner's suites keep each entry's seeds in a dict keyed by the seed."""
    result = {"entries": {"dqn_breakout": {"seeds": {
        "0": {"seed": 0, "eval_curve": [[100, 1.0], [200, 2.0]]},
        "2": {"seed": 2, "eval_curve": [[100, 3.0], [200, 4.0]]},
    }}}}  # fmt: skip
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(result))
    curves = curves_from_json(path)
    assert list(curves) == ["dqn_breakout/eval_curve"]
    assert [c[0] for c in curves["dqn_breakout/eval_curve"]] == ["seed 0", "seed 2"]


def test_plot_command_writes_an_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    src = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "dqn_cartpole.json"
    assert main(["plot", f"plot.inputs=[{src}]", "plot.out=out/curves.png"]) == 0
    image = tmp_path / "out" / "curves.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", "plot.inputs=[missing.json]"]) == 2
    assert "plot input not found: missing.json" in capsys.readouterr().err


@pytest.mark.slow
def test_plot_reads_the_seeds_of_a_run_from_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from rl_lightning.cli.plot import curves_from_mlflow

    monkeypatch.chdir(tmp_path)
    quick = ["+experiment=dqn_cartpole", "device=cpu", "progress_bar=false", "total_frames=400",
             "collect.warmup_frames=100", "collect.frames_per_batch=50", "eval.every_frames=200",
             "eval.episodes=1"]  # fmt: skip
    for seed in (0, 1):
        assert main(["fit", *quick, f"seed={seed}"]) == 0
    curves = curves_from_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}", "dqn_cartpole")
    assert sorted(c[0] for c in curves["eval/return_mean"]) == ["seed 0", "seed 1"]
    assert [c[1].tolist() for c in curves["eval/return_mean"]] == [[200.0, 400.0]] * 2
    assert main(["plot", "plot.inputs=[mlflow:dqn_cartpole]", "plot.metric=eval/return_mean"]) == 0
    assert (tmp_path / "curves.png").is_file()


def test_frames_read_as_thousands_and_millions_and_panels_fill_their_grid() -> None:
    assert [frames_label(v) for v in (0, 500, 1000, 100_000, 1_500_000, 2e6)] == [
        "0", "500", "1k", "100k", "1.5M", "2M"
    ]  # fmt: skip
    assert [grid(n) for n in range(1, 8)] == [(1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (2, 3), (3, 3)]
    # Never a whole empty row: at most columns - 1 empty panels.
    assert all(r * c - n < c for n in range(1, 30) for r, c in [grid(n)])


def test_legends_read_the_labels_given_or_the_run_names(tmp_path: Path, monkeypatch, capsys) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    src = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "dqn_cartpole.json"
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig: drawn.append(fig))
    assert main(["plot", f"plot.inputs=[{src},{src}]", "plot.labels=[DQN seed sweep,again]"]) == 0
    (ax,) = [a for a in drawn[0].axes if a.get_visible()]
    assert ax.get_legend().get_texts()[0].get_text().startswith("DQN seed sweep")
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert any(t.endswith("k") for t in ticks) and not any(len(t) > 5 for t in ticks), ticks
    assert default_label("mlflow:sac_hockey") == "sac hockey" and default_label(str(src)) == "dqn cartpole"
    assert main(["plot", f"plot.inputs=[{src}]", "plot.labels=[a,b]"]) == 2
    assert "plot.labels has 2 labels for 1 inputs" in capsys.readouterr().err
