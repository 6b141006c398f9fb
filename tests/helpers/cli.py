"""Running the real CLI (in a subprocess, or in this process) and reading the MLflow store it writes; what
the CLI tests check across a resume (trajectory ids, the rows handed to the replay)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # imported where used: the GPU image has no MLflow, and gpu tests import this module
    import mlflow

#: Overrides that make any experiment a smoke run of a few hundred frames.
SMOKE = ("progress_bar=false", "eval.episodes=2", "eval.every_frames=0")


def run_cli(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m rl_lightning ARGS`` in ``cwd``; returns the finished process (text output)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run(
        [sys.executable, "-m", "rl_lightning", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def run_main(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``rl_lightning.cli.main(ARGS)`` in this process with ``cwd`` as the working directory; returns what
    :func:`run_cli` returns. The same code path without a new interpreter, whose imports (torch, Lightning,
    TorchRL, MLflow) cost several seconds a run: for tests of what a run does, not of the process (exit on
    a signal, a fresh install, the import graph), which keep :func:`run_cli`."""
    from rl_lightning.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["rl_lightning", *args], code, out.getvalue(), err.getvalue())


def interrupt_cli(
    cwd: Path, *args: str, after_path: Path, after_glob: str = "*", timeout: float = 300
) -> subprocess.CompletedProcess:
    """Starts the CLI, sends SIGINT (Ctrl-C) once ``after_path`` has a match for ``after_glob``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_lightning", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As from a terminal, even when the tests run in the background (which ignores SIGINT).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + timeout
    while not (after_path.exists() and any(after_path.glob(after_glob))):
        if proc.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def mlflow_runs(cwd: Path) -> list:
    """Every run in the SQLite store that the CLI writes by default in ``cwd``."""
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rl_lightning")
    return [] if exp is None else client.search_runs([exp.experiment_id])


def mlflow_client(cwd: Path) -> mlflow.MlflowClient:
    import mlflow

    return mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")


#: A TD-MPC2 small enough for CPU tests: the 1M model narrowed to width 16 and a one-iteration planner
#: of 16 samples (add ``+experiment=tdmpc2_pendulum`` or another TD-MPC2 experiment before it).
TINY_TDMPC2 = (
    "algo.model_size=1M", "algo.latent_dim=16", "algo.mlp_dim=16", "algo.enc_dim=16",
    "algo.num_samples=16", "algo.num_elites=4", "algo.num_pi_trajs=2", "algo.iterations=1",
)  # fmt: skip


def check_trajectories_across_resume(before_run, resumed_run, per_side: int) -> None:
    """A resumed run's replay holds ``per_side`` trajectories from before the resume and ``per_side`` new
    ones numbered past them, each id its own, with step counts 0, 1, 2, ... without a gap."""
    from rl_lightning.data.replay import TRAJ_KEY

    def stored(run):
        return run.datamodule.replay.storage[: len(run.datamodule.replay)]

    before = stored(before_run)[TRAJ_KEY].unique()
    after = stored(resumed_run)
    ids, steps = after[TRAJ_KEY].reshape(-1), after["step_count"].reshape(-1)
    assert before.numel() == per_side
    new = torch.tensor(sorted(set(ids.tolist()) - set(before.tolist())))
    assert new.numel() == per_side and int(new.min()) > int(before.max())
    for i in ids.unique():
        assert torch.equal(steps[ids == i].sort().values, torch.arange(int((ids == i).sum())))


class ReplayedRows:
    """Records every row the data path's n-step stage hands the replay, with every key it keeps (the replay
    stores only the algorithm's ``sample_keys`` of them). ``ReplayedRows(run.datamodule)`` before the fit;
    :meth:`check_stored` afterwards compares them with what the replay holds and returns them."""

    def __init__(self, dm) -> None:
        self._dm, self._inner, self._rows = dm, dm.ingestion.nstep, []
        dm.ingestion.nstep = self

    def __call__(self, batch, keys=None):
        out = self._inner(batch, keys)
        self._rows.append(out.reshape(-1).clone())
        return out

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def check_stored(self):
        """The replay holds these rows in order, each stored key with the value handed over; returns them."""
        rows, replay = torch.cat(self._rows), self._dm.replay
        stored = replay.storage[: len(replay)]
        assert len(stored) == len(rows)
        keys = set(stored.keys(True, True)) - {"index"}  # TorchRL's buffer writes each row's index
        assert keys < set(rows.keys(True, True)) and ("next", "done") not in keys  # pruned
        for key in keys:
            assert torch.equal(stored[key], rows[key]), key
        return rows


#: A short in-process run's settings: no logger or evaluations, 64 warm-up frames, collections of 16.
SHORT_RUN = [
    "logger=none", "device=cpu", "progress_bar=false", "eval.every_frames=0", "eval.episodes=1",
    "collect.warmup_frames=64", "collect.frames_per_batch=16",
]  # fmt: skip


def build_short_run(
    workdir: Path,
    monkeypatch,
    experiment: str,
    overrides: list[str],
    frames: int,
    checkpoint_every: int,
    *extra: str,
):
    """A sized-down run of ``experiment`` built in ``workdir`` (the current directory for its run folder):
    ``frames`` frames, a checkpoint every ``checkpoint_every``, :data:`SHORT_RUN`'s settings."""
    from rl_lightning.cli import compose
    from rl_lightning.cli.run import build_run

    workdir.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(workdir)
    return build_run(compose([
        f"+experiment={experiment}", *overrides, *SHORT_RUN, f"total_frames={frames}",
        f"checkpoint.every_frames={checkpoint_every}", *extra,
    ]))  # fmt: skip
