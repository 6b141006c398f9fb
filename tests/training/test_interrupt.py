"""Ctrl-C at any point of the loop stops the run at the next safe point with a checkpoint that resumes; so
does SIGTERM, which Lightning alone would turn into an abort without the final checkpoint.

The signal is sent to this very process from inside the phase under test (collecting, extending the
replay, updating, evaluating, writing a checkpoint), through the same ``fit`` command the CLI runs.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rl_lightning.cli import compose
from rl_lightning.cli.fit import fit
from rl_lightning.data.collection import Policy
from rl_lightning.data.datamodule import RLDataModule
from rl_lightning.data.ingest import Ingestion
from rl_lightning.training.safe_load import load_checkpoint

BASE = [
    "+experiment=dqn_cartpole",
    "logger=none",
    "device=cpu",
    "progress_bar=false",
    "collect.frames_per_batch=32",
    "collect.warmup_frames=64",
    "eval.every_frames=128",
    "eval.episodes=2",
    "checkpoint.every_frames=64",
]


@pytest.fixture(autouse=True)
def terminal_sigint() -> Iterator[None]:
    """SIGINT as in a terminal. A process started in the background (nohup, `cmd &` in a script, some CI
    runners and test workers) inherits SIGINT ignored, and the run then rightly ignores it too."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _interrupting(original: Callable, calls_before: int, signum: int = signal.SIGINT) -> Callable:
    """``original`` that sends ``signum`` to this process on its ``calls_before + 1``-th call, mid-call."""
    count = {"n": 0}

    def wrapped(*args, **kwargs):
        count["n"] += 1
        if count["n"] == calls_before + 1:
            os.kill(os.getpid(), signum)  # handled between bytecodes, i.e. inside this call
        return original(*args, **kwargs)

    return wrapped


PHASES = {
    # (object, attribute, calls before the interrupting one)
    "collect": (Policy, "__call__", 80),
    "extend": (Ingestion, "ingest", 6),
    "update": ("module", "update", 40),
    "evaluate": ("module", "act_eval", 30),
    "checkpoint": (RLDataModule, "save_replay", 1),
}


CASES = [(phase, signal.SIGINT) for phase in sorted(PHASES)] + [
    ("update", signal.SIGTERM),
    ("evaluate", signal.SIGTERM),
]


@pytest.mark.parametrize(("phase", "signum"), CASES, ids=[f"{p}-{s.name}" for p, s in CASES])
def test_a_stop_signal_in_every_phase_leaves_a_checkpoint_that_resumes(
    phase: str,
    signum: signal.Signals,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    owner, name, calls = PHASES[phase]
    if owner != "module":
        monkeypatch.setattr(owner, name, _interrupting(getattr(owner, name), calls, signum))
    else:
        from rl_lightning.algos.dqn import DQN

        monkeypatch.setattr(DQN, name, _interrupting(getattr(DQN, name), calls, signum))
    sigterm_before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        fit(compose([*BASE, "total_frames=100000"]))
    out = capsys.readouterr()
    assert "stopping at the next safe point" in out.err and "Traceback" not in out.err
    assert ("SIGTERM:" in out.err) == (signum == signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is sigterm_before, "fit left its SIGTERM handler behind"
    assert "interrupted:" in out.out and "last checkpoint:" in out.out
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    (last,) = tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")
    ckpt = load_checkpoint(last)
    stopped = next(v for k, v in ckpt.items() if k.endswith("RLDataModule"))["frames"]
    assert 0 < stopped < 100_000
    replay = Path(str(last) + ".replay")
    assert replay.is_dir() and not replay.with_name(replay.name + ".tmp").exists()
    # The replay beside it holds exactly the frames the checkpoint counts.
    from tensordict import TensorDict  # noqa: F401  (the storage loads TensorDicts)
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000))
    rb.loads(replay)
    assert len(rb) == stopped
    run = fit(compose([*BASE, f"total_frames={stopped + 64}", "ckpt_path=last"]))
    assert run.datamodule.frames == stopped + 64 and run.datamodule.resumed_frames == stopped


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_stop_signal_aborts_without_the_final_checkpoint(
    signum: signal.Signals,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A second Ctrl-C raises at once; a second SIGTERM is Lightning's, which ends the run after the
    current update. Neither writes the final checkpoint."""
    from rl_lightning.algos.dqn import DQN

    monkeypatch.chdir(tmp_path)
    original = DQN.update
    count = {"n": 0}

    def twice(self, batch):
        count["n"] += 1
        if count["n"] == 20:
            os.kill(os.getpid(), signum)  # asks for a stop ...
            os.kill(os.getpid(), signum)  # ... and insists before the step is over
        return original(self, batch)

    monkeypatch.setattr(DQN, "update", twice)
    with pytest.raises(KeyboardInterrupt):
        fit(compose([*BASE, "total_frames=100000"]))
    out = capsys.readouterr()
    assert count["n"] == 20, f"the run went on after the second {signum.name}"
    assert "aborted: the last checkpoint is in" in out.out and "interrupted:" not in out.out
    # Lightning ignores Ctrl-C while it shuts down; afterwards the process has Python's default again.
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT)


class _PipeOut:
    """stdout to a pipe whose reader goes away: once ``closed``, every write raises ``BrokenPipeError``."""

    def __init__(self) -> None:
        self.closed_by_reader = False
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        if self.closed_by_reader:
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        if self.closed_by_reader:
            raise BrokenPipeError(32, "Broken pipe")


def test_a_closed_output_pipe_stops_the_run_with_a_checkpoint_that_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fit ... | head`, or a parent that started the run and ended: the next print used to raise
    ``BrokenPipeError`` inside the loop, and the run ended FAILED without a checkpoint."""
    from rl_lightning.algos.dqn import DQN

    monkeypatch.chdir(tmp_path)
    out = _PipeOut()
    monkeypatch.setattr("sys.stdout", out)
    original = DQN.update
    count = {"n": 0}

    def update_then_print(self, batch):
        count["n"] += 1
        if count["n"] == 20:
            out.closed_by_reader = True
            print("a message while nobody reads")
        return original(self, batch)

    monkeypatch.setattr(DQN, "update", update_then_print)
    with pytest.raises(KeyboardInterrupt):
        fit(compose([*BASE, "total_frames=100000"]))
    assert sys.stdout is out, "fit left its output guard behind"
    assert any(line.startswith("fit dqn_cartpole") for line in out.lines)
    (last,) = tmp_path.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt")
    stopped = next(v for k, v in load_checkpoint(last).items() if k.endswith("RLDataModule"))["frames"]
    assert 0 < stopped < 100_000
    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    run = fit(compose([*BASE, f"total_frames={stopped + 64}", "ckpt_path=last"]))
    assert run.datamodule.resumed_frames == stopped
