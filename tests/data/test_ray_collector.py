"""Collection on Ray (``collect.backend=ray``): TorchRL's RayCollector, the optional ``ray`` extra.

Without Ray installed only the checks of the config run (among them the one line a run that asks for
Ray prints); everything that starts Ray is skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.cli import TINY_TDMPC2, check_trajectories_across_resume, run_cli

from rl_lightning.cli import CliError, compose, main
from rl_lightning.data.datamodule import CollectConfig
from rl_lightning.data.ray_collect import RAY_MISSING, _traj_ranges

RAY_CLI = ("+experiment=dqn_cartpole", "+debug=quick", "collect.backend=ray", "collect.workers=2")


def _ray() -> None:
    pytest.importorskip("ray")


# ------------------------------------------------------------------------------ without Ray
def test_a_run_that_asks_for_ray_without_it_is_one_line_with_exit_code_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError, as when it is absent
    assert main(["fit", *RAY_CLI]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {RAY_MISSING}"]
    assert "pip install 'rl_lightning[ray]'" in err[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "ray", "workers": 0}, "collect.backend=ray needs collect.workers >= 1"),
        ({"ray_address": "auto"}, "collect.ray_address is for collect.backend=ray"),
        ({"backend": "cluster"}, "collect.backend='cluster': choose local or ray"),
    ],
)
def test_combinations_that_cannot_work_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CollectConfig(**kwargs)


def test_every_actor_numbers_its_trajectories_in_a_range_of_its_own() -> None:
    states = _traj_ranges(start=7, workers=3, num_envs=2, frames_per_worker=16, remaining_frames=1000)
    starts = [int(s["traj_pool"]["traj_id"]) for s in states]
    stride = starts[1] - starts[0]
    assert starts[0] == 7 and starts[2] - starts[1] == stride
    # An actor opens at most one trajectory per env and one per frame, even with the whole budget.
    assert stride > 1000 + 16 + 2
    with pytest.raises(ValueError, match="int32"):
        _traj_ranges(start=0, workers=8, num_envs=1, frames_per_worker=16, remaining_frames=2**29)


# ------------------------------------------------------------------------------ with Ray
def test_ray_with_ddp_is_refused_before_anything_starts(tmp_path: Path, monkeypatch) -> None:
    _ray()
    from rl_lightning.cli.run import build_run

    monkeypatch.chdir(tmp_path)
    cfg = compose([*RAY_CLI, "trainer=ddp", "device=cpu"])
    with pytest.raises(CliError, match=r"collect\.backend=ray collects for one training process"):
        build_run(cfg)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_fit_collects_on_ray_through_the_cli_and_exits(tmp_path: Path) -> None:
    _ray()
    start = time.perf_counter()
    proc = run_cli(tmp_path, "fit", *RAY_CLI, timeout=240)  # a Ray left hanging would hit the timeout
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["frames"] == 500 and summary["updates"] > 0
    assert Path(tmp_path, summary["last_ckpt"]).is_file()
    assert Path(tmp_path, summary["last_ckpt"] + ".replay").is_dir()
    assert "Traceback" not in proc.stderr
    assert time.perf_counter() - start < 240


@pytest.mark.gpu
@pytest.mark.slow
def test_a_module_on_the_gpu_sends_its_weights_to_actors_that_act_on_their_cpu(tmp_path: Path) -> None:
    _ray()
    proc = run_cli(tmp_path, "fit", *RAY_CLI, "device=cuda", "replay.device=cuda", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["frames"] == 500


@pytest.mark.slow
def test_ctrl_c_stops_a_ray_run_with_a_checkpoint(tmp_path: Path) -> None:
    """SIGINT to the whole process group, as a terminal sends it: Ray's processes get it too."""
    _ray()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_lightning", "fit", *RAY_CLI, "total_frames=1000000"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        start_new_session=True,  # a process group of its own, which the test interrupts as a whole
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    runs = tmp_path / "runs"
    deadline = time.monotonic() + 240
    while not any(runs.glob("debug/dqn_cartpole/*/checkpoints/last.ckpt")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "stopping at the next safe point" in err and "Traceback" not in err
    assert "interrupted:" in out and "last checkpoint:" in out


class _FlipGreedyAction:
    """After ``at`` updates (at the end of that round), makes action 1 the greedy one by far (was 0)."""

    def __init__(self, at: int) -> None:
        import lightning as L

        self.at = at
        self.frames_at_flip: int | None = None
        outer = self

        class Flip(L.Callback):
            def on_train_batch_end(self, trainer, pl_module, *args) -> None:
                if outer.frames_at_flip is None and trainer.datamodule.updates >= outer.at:
                    with torch.no_grad():
                        _last_linear(pl_module).bias.copy_(torch.tensor([-1000.0, 1000.0]))
                    outer.frames_at_flip = trainer.datamodule.frames

        self.callback = Flip()


def _last_linear(module) -> torch.nn.Linear:
    return [m for m in module.online.modules() if isinstance(m, torch.nn.Linear)][-1]


@pytest.mark.slow
@pytest.mark.parametrize("sync", [True, False])
def test_ray_actors_act_with_the_weights_of_the_module(sync: bool, tmp_path: Path, monkeypatch) -> None:
    _ray()
    from rl_lightning.cli.run import build_run

    monkeypatch.chdir(tmp_path)
    cfg = compose([
        "+experiment=dqn_cartpole", "logger=none", "device=cpu", "progress_bar=false", "total_frames=1024",
        "collect.backend=ray", "collect.workers=2", f"collect.sync_workers={sync}",
        "collect.frames_per_batch=64", "collect.warmup_frames=128", "algo.eps_start=0.0", "algo.eps_end=0.0",
        "algo.lr=1e-6", "eval.every_frames=0", "eval.episodes=1", "replay.capacity=2000",
    ])  # fmt: skip
    run = build_run(cfg)
    with torch.no_grad():
        _last_linear(run.module).bias.copy_(torch.tensor([1000.0, -1000.0]))  # greedy: always action 0
    flip = _FlipGreedyAction(at=100)
    run.trainer.callbacks.append(flip.callback)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    import ray

    assert not ray.is_initialized(), "the Ray runtime the fit started outlived it"
    assert run.datamodule.frames == 1024
    actions = run.datamodule.replay.storage[: len(run.datamodule.replay)]["action"].reshape(-1)
    # Storage order is collection order: random warm-up, then action 0, then, one collection after the
    # flip (the weights reach the actors before every collection), only action 1.
    assert (actions[128:300] == 0).all()
    cut = flip.frames_at_flip + 128  # a collection in flight at the flip may still use the old weights
    assert cut < 1024 and (actions[cut:] == 1).all()


@pytest.mark.slow
def test_trajectories_of_ray_actors_stay_apart_also_after_a_resume(tmp_path: Path, monkeypatch) -> None:
    _ray()
    from rl_lightning.cli.fit import fit

    monkeypatch.chdir(tmp_path)
    base = [
        "+experiment=tdmpc2_pendulum", "logger=none", "device=cpu", "progress_bar=false",
        "collect.backend=ray", "collect.workers=2", "collect.warmup_frames=120", "collect.frames_per_batch=8",
        "env.num_envs=2", "replay.batch_size=24", *TINY_TDMPC2, "eval.every_frames=0", "eval.episodes=1",
        "replay.capacity=1000", "checkpoint.every_frames=240",
    ]  # fmt: skip
    first = fit(compose([*base, "total_frames=240"]))
    run = fit(compose([*base, "total_frames=320", "ckpt_path=last"]))
    assert run.datamodule.frames == 320
    # 2 actors x 2 envs, Pendulum's 200-step episodes: four trajectories before the resume and four new
    # ones after it (the resumed envs start new episodes).
    check_trajectories_across_resume(first, run, per_side=4)
