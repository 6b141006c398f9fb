"""Videos of the deterministic policy: the frames the env renders, written as GIF/MP4, logged to MLflow."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_lightning.cli import compose, main
from rl_lightning.cli.run import build_module, env_config
from rl_lightning.training.video import VideoError, record_video

iio = pytest.importorskip("imageio.v3")


@pytest.mark.slow
def test_a_hockey_video_holds_the_rendered_frames_of_the_episode(tmp_path: Path) -> None:
    # The untrained policy's weights decide when the episode ends (with some, a goal at frame 39): seeded,
    # so that the episode outlasts 40 frames whatever ran before in this process.
    torch.manual_seed(1)
    cfg = compose(
        ["+experiment=tdmpc2_hockey_cpu", "algo.mpc=false", "algo.latent_dim=16", "algo.mlp_dim=16"]
    )
    module = build_module(cfg, env_config(cfg))
    env = env_config(cfg)
    path = record_video(module, env, tmp_path / "game.gif", episodes=1, seed=3, max_frames=40)
    frames = iio.imread(path)
    assert frames.shape == (40, 480, 600, 3)  # the hockey renderer's frames, capped at max_frames
    assert frames.std(axis=0).max() > 0  # the game moves
    # The same seed gives the same video.
    again = iio.imread(record_video(module, env, tmp_path / "again.gif", episodes=1, seed=3, max_frames=40))
    np.testing.assert_array_equal(frames, again)


def test_an_unknown_format_is_one_clear_error(tmp_path: Path) -> None:
    cfg = compose(["+experiment=dqn_cartpole"])
    with pytest.raises(VideoError, match="choose one of gif, mp4"):
        record_video(build_module(cfg, env_config(cfg)), env_config(cfg), tmp_path / "x.avi")


@pytest.mark.slow
def test_fit_records_videos_as_mlflow_artifacts_and_evaluate_writes_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import mlflow

    monkeypatch.chdir(tmp_path)
    fit = [
        "fit", "+experiment=dqn_cartpole", "device=cpu", "progress_bar=false", "total_frames=600",
        "collect.frames_per_batch=50", "collect.warmup_frames=100", "eval.every_frames=300",
        "eval.episodes=1", "eval.video.every_frames=300",
    ]  # fmt: skip
    assert main(fit) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    videos = sorted(p.name for p in (tmp_path / out["run_dir"] / "videos").iterdir())
    assert videos == ["eval_300.gif", "eval_600.gif"]
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = (tmp_path / out["run_dir"] / "mlflow_run_id").read_text()
    assert sorted(a.path for a in client.list_artifacts(run_id, "videos")) == [f"videos/{v}" for v in videos]
    assert main(["evaluate", f"ckpt={out['best_ckpt']}", "video=true", "logger=none"]) == 0
    assert Path(out["best_ckpt"]).with_name("best-video.gif").is_file()
