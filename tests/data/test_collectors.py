"""Multi-process collection inside one process of the run: TorchRL's multi-collectors over workers."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest
import torch
from helpers.cli import TINY_TDMPC2, check_trajectories_across_resume

from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run

pytestmark = pytest.mark.slow


class FlipGreedyAction(L.Callback):
    """After ``at`` updates (at the end of that round), makes action 1 the greedy one by far (was 0)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.frames_at_flip: int | None = None

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        if self.frames_at_flip is None and trainer.datamodule.updates >= self.at:
            with torch.no_grad():
                last_linear(pl_module).bias.copy_(torch.tensor([-1000.0, 1000.0]))
            self.frames_at_flip = trainer.datamodule.frames


def last_linear(module) -> torch.nn.Linear:
    return [m for m in module.online.modules() if isinstance(m, torch.nn.Linear)][-1]


@pytest.mark.parametrize("sync", [True, False])
def test_workers_act_with_the_weights_of_the_module(sync: bool, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = compose([
        "+experiment=dqn_cartpole", "logger=none", "device=cpu", "progress_bar=false", "total_frames=1024",
        "collect.workers=2", f"collect.sync_workers={sync}", "collect.frames_per_batch=64",
        "collect.warmup_frames=128", "algo.eps_start=0.0", "algo.eps_end=0.0", "algo.lr=1e-6",
        "eval.every_frames=0", "eval.episodes=1", "replay.capacity=2000",
    ])  # fmt: skip
    run = build_run(cfg)
    head = last_linear(run.module)
    with torch.no_grad():
        head.bias.copy_(torch.tensor([1000.0, -1000.0]))  # greedy: always action 0
    flip = FlipGreedyAction(at=100)
    run.trainer.callbacks.append(flip)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert run.datamodule.frames == 1024
    stored = run.datamodule.replay.storage[: len(run.datamodule.replay)]
    actions = stored["action"].reshape(-1)
    # Storage order is collection order: random warm-up, then action 0, then, one collection after the
    # flip (the weights reach the workers before every collection), only action 1.
    assert (actions[128:300] == 0).all()
    cut = flip.frames_at_flip + 128  # the collection in flight at the flip may still use the old weights
    assert cut < 1024 and (actions[cut:] == 1).all()


def test_workers_of_an_actor_critic_act_with_the_weights_of_the_module(tmp_path: Path, monkeypatch) -> None:
    """SAC's module holds a TorchRL loss (parameter dicts): its worker copies are rebuilt and synced too."""
    monkeypatch.chdir(tmp_path)
    cfg = compose([
        "+experiment=sac_pendulum", "logger=none", "device=cpu", "progress_bar=false", "total_frames=256",
        "collect.workers=2", "collect.frames_per_batch=32", "collect.warmup_frames=64",
        "collect.updates_per_frame=0.03", "algo.actor_lr=1e-9", "algo.critic_lr=1e-9", "algo.alpha_lr=1e-9",
        "eval.every_frames=0", "eval.episodes=1", "replay.capacity=1000",
        "replay.batch_size=8",
    ])  # fmt: skip
    run = build_run(cfg)
    last = [m for m in run.module.actor_net.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():  # mean action tanh(atanh(0.5)) = 0.5 (torque 1.0), the smallest spread
        last.weight.zero_()
        last.bias.copy_(torch.tensor([0.5493, -1000.0]))
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert run.datamodule.frames == 256
    stored = run.datamodule.replay.storage[: len(run.datamodule.replay)]
    acted = stored["action"].reshape(-1)[64:]  # after the random warm-up: the workers' policy
    # Freshly built worker weights (no sync) would act around 0 with a wide spread.
    torch.testing.assert_close(acted, torch.full_like(acted, 1.0), atol=0.05, rtol=0)


def test_trajectories_of_local_workers_stay_apart_after_a_resume(tmp_path: Path, monkeypatch) -> None:
    from rl_lightning.cli.fit import fit

    monkeypatch.chdir(tmp_path)
    base = [
        "+experiment=tdmpc2_pendulum", "logger=none", "device=cpu", "progress_bar=false",
        "collect.workers=2", "collect.warmup_frames=120", "collect.frames_per_batch=8", "env.num_envs=2",
        "replay.batch_size=24", *TINY_TDMPC2, "eval.every_frames=0", "eval.episodes=1",
        "replay.capacity=1000", "checkpoint.every_frames=240",
        # Few updates: what is checked is the ids the workers write, and TD-MPC2's updates (one per frame,
        # and a burst of one per warm-up frame) were most of the test's time.
        "collect.updates_per_frame=0.05", "collect.warmup_burst=false",
    ]  # fmt: skip
    first = fit(compose([*base, "total_frames=240"]))  # 2 workers x 2 envs: four trajectories
    run = fit(compose([*base, "total_frames=320", "ckpt_path=last"]))
    assert run.datamodule.frames == 320
    # Four trajectories before the resume and four new ones after it (the workers' envs start new
    # episodes), numbered past the stored ones; each with its own id, whose step counts run 0, 1, 2, ...
    # without a gap (Pendulum's episodes last 200 steps: none ended).
    check_trajectories_across_resume(first, run, per_side=4)
