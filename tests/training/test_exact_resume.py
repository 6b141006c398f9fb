"""A run stopped after a checkpoint and resumed from it ends with the weights of the run never stopped.

For each family (sized down to a few hundred frames) one run goes to the end uninterrupted. The same run
is stopped twice more, at two different points, and resumed from what the stop left on disk:

- killed (SIGKILL, a preempted job): nothing is written at the stop, so the resume starts from the periodic
  ``last.ckpt`` (and its replay) as it was on disk right after the first one was written;
- Ctrl-C in the middle of the run (after that checkpoint): the run stops at its next safe point and writes
  ``last.ckpt`` there.

Each resumed run must end with every tensor of the module's state equal, bit for bit, to the uninterrupted
run's: the resume has to bring back everything the rest of the run draws from (the envs' episodes, the
collector's carried step, n-step windows, frame stacks, the budget's counters, the replay, every random
stream). Losing any of it changes the data collected after the resume, and the weights with it.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from helpers.cli import TINY_TDMPC2, build_short_run

from rl_lightning.cli.run import Run
from rl_lightning.training.checkpoint import FrameCheckpoint, replay_path

pytestmark = pytest.mark.slow

SMALL = ["algo.hidden_sizes=[16,16]"]
#: experiment -> overrides that size it down; every family, a MinAtar game (image observations, frames
#: stored once) and hockey.
CASES = {
    "dqn_cartpole": SMALL,
    "rainbow_cartpole": SMALL,  # C51 with noisy nets, prioritized replay and 3-step returns
    "qrdqn_cartpole": SMALL,
    "iqn_cartpole": SMALL,
    "sac_pendulum": SMALL,
    "td3_pendulum": SMALL,
    "sac_options_pendulum": SMALL,
    "tdmpc2_pendulum": [*TINY_TDMPC2, "replay.batch_size=24", "collect.updates_per_frame=0.25"],
    "ppo_cartpole": [*SMALL, "algo.rollout_steps=8", "algo.epochs=2", "algo.minibatches=2"],
    "dqn_minatar": ["replay.batch_size=16"],
    "sac_hockey": [*SMALL, "env.num_envs=2", "replay.batch_size=32"],  # Box2D, replayed from its start
}
FRAMES = 320
#: The first periodic checkpoint, from which the killed run resumes.
KILLED_AT = 128


@pytest.fixture(autouse=True)
def terminal_sigint() -> Iterator[None]:
    """SIGINT as in a terminal (a test process started in the background inherits it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def build(workdir: Path, monkeypatch: pytest.MonkeyPatch, name: str, *extra: str) -> Run:
    return build_short_run(workdir, monkeypatch, name, CASES[name], FRAMES, KILLED_AT, *extra)


def fit(run: Run) -> Run:
    run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=run.ckpt_path)
    return run


def weights(run: Run) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in run.module.state_dict().items()}


def assert_same_weights(resumed: Run, reference: Run, how: str) -> None:
    assert (resumed.datamodule.frames, resumed.datamodule.updates) == (
        reference.datamodule.frames,
        reference.datamodule.updates,
    ), how
    ours, theirs = weights(resumed), weights(reference)
    assert ours.keys() == theirs.keys()
    differing = [k for k in ours if not torch.equal(ours[k], theirs[k])]
    assert not differing, f"{how}: {len(differing)} of {len(ours)} tensors differ, e.g. {differing[:3]}"


def run_and_keep_the_first_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> tuple[Run, Path]:
    """Runs ``name`` uninterrupted; returns where a copy of its first periodic ``last.ckpt`` (and replay)
    lies: what a SIGKILL right after that checkpoint leaves on disk (checkpoints are written atomically)."""
    killed = tmp_path / "killed" / "checkpoints"
    write = FrameCheckpoint._write

    def write_and_keep_the_first(self, trainer, path, with_replay):
        write(self, trainer, path, with_replay)
        if with_replay and not killed.exists():
            killed.mkdir(parents=True)
            shutil.copy(path, killed / path.name)
            shutil.copytree(replay_path(path), replay_path(killed / path.name))

    monkeypatch.setattr(FrameCheckpoint, "_write", write_and_keep_the_first)
    reference = fit(build(tmp_path / "reference", monkeypatch, name))
    monkeypatch.setattr(FrameCheckpoint, "_write", write)
    assert (killed / "last.ckpt").is_file()
    return reference, killed


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_run_stopped_and_resumed_ends_with_the_weights_of_the_run_never_stopped(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, killed = run_and_keep_the_first_checkpoint(tmp_path, monkeypatch, name)
    resumed = fit(build(tmp_path / "reference", monkeypatch, name, f"ckpt_path={killed / 'last.ckpt'}"))
    assert resumed.datamodule.resumed_frames == KILLED_AT
    assert_same_weights(resumed, reference, f"killed at {KILLED_AT} frames")

    # The same run, stopped by Ctrl-C during an update three quarters of the way through.
    stop_at = 3 * reference.datamodule.updates // 4
    module_class = type(reference.module)
    update = module_class.update
    count = {"n": 0}

    def interrupted_update(self, batch):
        count["n"] += 1
        if count["n"] == stop_at:
            os.kill(os.getpid(), signal.SIGINT)  # handled between bytecodes, inside this update
        return update(self, batch)

    monkeypatch.setattr(module_class, "update", interrupted_update)
    stopped = fit(build(tmp_path / "stopped", monkeypatch, name))
    monkeypatch.setattr(module_class, "update", update)
    assert stopped.stop.requested and KILLED_AT < stopped.datamodule.frames < FRAMES
    (last,) = (tmp_path / "stopped").glob("runs/*/*/checkpoints/last.ckpt")
    resumed = fit(build(tmp_path / "stopped", monkeypatch, name, f"ckpt_path={last}"))
    assert resumed.datamodule.resumed_frames == stopped.datamodule.frames
    assert_same_weights(resumed, reference, f"Ctrl-C at {stopped.datamodule.frames} frames")
