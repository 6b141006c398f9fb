"""Data-parallel training over processes with Lightning's DDP (gloo on CPUs), through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.cli import mlflow_runs, run_main
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

pytestmark = pytest.mark.slow
ROOT, TESTS = Path(__file__).resolve().parents[2], Path(__file__).resolve().parents[1]

DDP = [
    "+experiment=dqn_cartpole", "trainer=ddp", "device=cpu", "progress_bar=false",
    "collect.frames_per_batch=32", "collect.warmup_frames=128", "eval.every_frames=0", "eval.episodes=2",
    "checkpoint.every_frames=256", "replay.capacity=5000",
]  # fmt: skip


def env() -> dict[str, str]:
    """The CLI's environment: the tests root on ``PYTHONPATH`` makes ``helpers.ddp`` importable; the
    repository comes before it, so that ``callbacks`` is the project's package and not the folder
    ``tests/callbacks`` (a namespace package there would win over the editable install's finder)."""
    path = os.pathsep.join(filter(None, [str(ROOT), str(TESTS), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def fit(cwd: Path, *args: str, timeout: float = 300) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "rl_lightning", "fit", *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dump(out: Path) -> list[str]:
    return ["+callbacks.dump._target_=helpers.ddp.ParamDump", f"+callbacks.dump.out={out}"]


def shard_lengths(last: Path) -> list[int]:
    out = []
    for shard in sorted(Path(str(last) + ".replay").glob("rank_*")):
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(5000))
        rb.loads(shard)
        out.append(len(rb))
    return out


def test_two_ranks_stop_together_on_ctrl_c_resume_on_two_ranks_only_and_train_alike(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_lightning", "fit", *DDP, "total_frames=200000"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
        start_new_session=True,  # its own process group: Ctrl-C in a terminal reaches every rank
        # As from a terminal, even when the tests run in the background (which ignores SIGINT).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while (
        not list(tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")) and time.monotonic() < deadline
    ):
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    (last,) = tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")
    frames = next(v for k, v in torch.load(last, weights_only=True).items() if k.endswith("RLDataModule"))[
        "frames"
    ]
    # Each rank its own envs and replay shard, half the frames each; both stopped after the same collection.
    assert shard_lengths(last) == [frames // 2, frames // 2]
    # Resuming on one rank is refused with what to do, and leaves the checkpoint as it was.
    refused = run_main(tmp_path, "fit", "+experiment=dqn_cartpole", "device=cpu", "logger=none",
                       f"total_frames={frames + 128}", "ckpt_path=last", "replay.capacity=5000")  # fmt: skip
    assert refused.returncode == 2
    assert "was written by 2 ranks; resume it with trainer.devices=2" in refused.stderr
    assert shard_lengths(last) == [frames // 2, frames // 2]
    # On two ranks each restores its own shard, and the frame budget stays global.
    resumed = fit(tmp_path, *DDP, f"total_frames={frames + 128}", "ckpt_path=last", *dump(tmp_path / "p"))
    assert resumed["frames"] == frames + 128 and resumed["updates"] > 0
    assert shard_lengths(last) == [(frames + 128) // 2] * 2
    # DDP averaged the gradients: after every update both ranks hold the same parameters (and targets).
    ranks = [torch.load(tmp_path / "p" / f"rank_{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0].keys() == ranks[1].keys()
    for key in ranks[0]:
        torch.testing.assert_close(ranks[0][key], ranks[1][key], atol=1e-6, rtol=0, msg=key)
    (run,) = mlflow_runs(tmp_path)  # one MLflow run, written by rank 0, through the resume
    assert run.info.status == "FINISHED"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_localhost_with_torchrun(tmp_path: Path) -> None:
    """The multi-node recipe: one torchrun per node, here two "nodes" on this machine."""
    port = free_port()
    common = [
        "+experiment=dqn_cartpole", "device=cpu", "progress_bar=false", "logger=none", "total_frames=256",
        "collect.frames_per_batch=32", "collect.warmup_frames=64", "eval.every_frames=0", "eval.episodes=1",
        "trainer.strategy=ddp", "trainer.devices=1", "trainer.num_nodes=2", f"run_dir={tmp_path / 'run'}",
        "replay.capacity=5000", *dump(tmp_path / "p"),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={node}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "rl_lightning",
                "fit",
                *common,
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert json.loads(outs[0][0].strip().splitlines()[-1])["frames"] == 256
    ranks = [torch.load(tmp_path / "p" / f"rank_{r}.pt", weights_only=True) for r in (0, 1)]
    for key in ranks[0]:
        torch.testing.assert_close(ranks[0][key], ranks[1][key], atol=1e-6, rtol=0, msg=key)
    assert shard_lengths(tmp_path / "run" / "checkpoints" / "last.ckpt") == [128, 128]


def test_ppo_on_two_ranks_averages_gradients_over_each_ranks_rollouts(tmp_path: Path) -> None:
    # Each rank collects its own 2 envs x 32 steps per rollout; the budget counts both ranks' frames.
    out = fit(
        tmp_path, "+experiment=ppo_cartpole", "trainer=ddp", "device=cpu", "progress_bar=false",
        "logger=none", "env.num_envs=2", "algo.rollout_steps=32", "algo.epochs=2", "total_frames=512",
        "eval.every_frames=0", "eval.episodes=1", *dump(tmp_path / "p"),
    )  # fmt: skip
    # 512 frames = 4 rollouts of 64 frames on each of the 2 ranks, 2 updates (epochs x 1 minibatch) each.
    assert out["frames"] == 512 and out["updates"] == 4 * 2
    ranks = [torch.load(tmp_path / "p" / f"rank_{r}.pt", weights_only=True) for r in (0, 1)]
    for key in ranks[0]:
        torch.testing.assert_close(ranks[0][key], ranks[1][key], atol=1e-6, rtol=0, msg=key)
