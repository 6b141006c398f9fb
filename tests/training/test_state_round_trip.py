"""A checkpoint restores a run's whole training state, bit for bit, for every algorithm.

Each algorithm's experiment (sized down) trains for a few hundred frames through the real data path and
writes ``last.ckpt`` when it ends. A fresh run resumed from that checkpoint, with nothing left to train,
must hold what the first run held when it stopped: every parameter and buffer of the module (target
networks, averaged networks, schedules, counters), every optimizer's state, and the random streams of torch,
NumPy and Python. Then both take the next update on the same batch: the same random draws (noisy nets,
SAC's action samples, IQN's fractions, TD-MPC2's planning) give the same metrics and the same parameters,
bit for bit. A resume that loses anything of it (an optimizer's moments, a target network, the RNG) fails.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli import TINY_TDMPC2, build_short_run

from rl_lightning.cli.run import Run
from rl_lightning.data import persistence

pytestmark = pytest.mark.slow

SMALL = ["algo.hidden_sizes=[16,16]"]
CASES = {
    "dqn_cartpole": SMALL,
    "c51_cartpole": SMALL,
    "qrdqn_cartpole": SMALL,
    "iqn_cartpole": SMALL,
    "rainbow_cartpole": SMALL,  # noisy layers, PER, 3-step returns
    "sac_pendulum": SMALL,
    "sac_discrete_cartpole": SMALL,
    "td3_pendulum": SMALL,  # the delayed actor's host-side counter
    "ddpg_pendulum": SMALL,
    "aciqn_pendulum": ["algo.actor_hidden_sizes=[16,16]", "algo.critic_hidden_sizes=[16,16]"],
    "sac_options_pendulum": ["algo.hidden_sizes=[16,16]"],
    "tdmpc2_pendulum": [*TINY_TDMPC2, "replay.batch_size=24"],
    "dqn_minatar": [],  # frames stored once; the CNN torso
}
FRAMES = 240


def build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, *extra: str) -> Run:
    return build_short_run(tmp_path, monkeypatch, name, CASES[name], FRAMES, FRAMES, *extra)


def training_state(run: Run) -> dict:
    """What a resume must restore: module, optimizers, random streams (plain values, compared exactly)."""
    return {
        "module": {k: v.detach().clone() for k, v in run.module.state_dict().items()},
        "optimizers": [opt.state_dict() for opt in run.trainer.optimizers],
        "rng": persistence.rng_state(),
    }


def assert_same(a, b, where: str = "") -> None:
    """Equal bit for bit, through dicts, lists and tuples of tensors and plain values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def next_update(run: Run, rng: dict, seed: int = 7) -> tuple[dict, dict]:
    """One update on a sample of the run's replay drawn with ``seed`` (the same rows for both runs); the
    update draws its own random numbers from ``rng``, the run's streams (global to the process, so each
    run's are set back before its update)."""
    torch.manual_seed(seed)
    sample = run.datamodule.copies.to_module(run.datamodule.replay.sample())
    persistence.set_rng_state(rng)
    metrics = run.module.update(run.module.prepare_sample(sample))
    metrics = {k: v.clone() for k, v in metrics.items(True, True)}
    return metrics, {k: v.detach().clone() for k, v in run.module.state_dict().items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_resumed_run_holds_and_continues_the_saved_state(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = build(tmp_path, monkeypatch, name)
    first.trainer.fit(first.module, datamodule=first.datamodule)
    saved = training_state(first)
    assert first.datamodule.updates > 0 and any(opt.state for opt in first.trainer.optimizers)

    # Another process would start from other random streams: the resume must bring the saved ones back.
    torch.manual_seed(12345)
    np.random.seed(12345)
    random.seed(12345)
    last = first.run_dir.resolve() / "checkpoints" / "last.ckpt"
    resumed = build(tmp_path, monkeypatch, name, f"ckpt_path={last}")
    resumed.trainer.fit(resumed.module, datamodule=resumed.datamodule, ckpt_path=resumed.ckpt_path)
    assert resumed.datamodule.frames == FRAMES and resumed.datamodule.updates == first.datamodule.updates
    restored = training_state(resumed)
    assert_same(saved, restored, "state")

    assert_same(next_update(first, saved["rng"]), next_update(resumed, restored["rng"]), "next update")
