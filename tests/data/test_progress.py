"""The progress view and the episode log on their own, without a Trainer: read-only, current, every reader
its own episodes, the checkpoint keys kept; and through the data module, the replay saved and loaded by it."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rl_lightning.algos.dqn import DQN
from rl_lightning.data.budget import FrameBudget, Mark
from rl_lightning.data.datamodule import CollectConfig, RLDataModule
from rl_lightning.data.progress import EpisodeLog, Progress
from rl_lightning.data.replay import ReplayConfig
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.factory import EnvConfig, make_env


def view(total: int = 1000, warmup: int = 100) -> tuple[Progress, FrameBudget, EpisodeLog]:
    budget, log = FrameBudget(total_frames=total, warmup_frames=warmup), EpisodeLog()
    cpu = torch.device("cpu")
    return Progress(budget, log, DeviceCopies(cpu, cpu)), budget, log


def test_the_view_follows_the_budget_and_the_episodes() -> None:
    progress, budget, log = view()
    assert (progress.frames, progress.updates, progress.total_frames, progress.warmup_frames) == (
        0,
        0,
        1000,
        100,
    )
    assert (
        progress.in_warmup and not progress.spent and progress.episodes == 0 and progress.recent_returns == ()
    )
    budget.add(100)
    budget.take_update()
    log.add([1.0, 2.0], [10, 20])
    assert (progress.frames, progress.updates, progress.episodes) == (100, 1, 2)
    assert not progress.in_warmup and progress.recent_returns == (1.0, 2.0)
    log.add([float(i) for i in range(30)], [1] * 30)
    assert progress.recent_returns == tuple(float(i) for i in range(10, 30)), "the last 20"
    budget.add(900)
    assert progress.spent


def test_the_view_is_read_only() -> None:
    progress, budget, _ = view()
    for name, value in (
        ("frames", 5),
        ("total_frames", 1),
        ("updates", 3),
        ("episodes", 1),
        ("_budget", None),
    ):
        with pytest.raises(AttributeError):
            setattr(progress, name, value)
    with pytest.raises(TypeError):
        progress.recent_returns[0] = 1.0  # a copy, never the log's own deque
    assert budget.frames == 0 and budget.total_frames == 1000


def test_every_reader_reads_every_episode_once_and_the_log_forgets_what_all_have_read() -> None:
    progress, _, log = view()
    log.add([1.0], [5])  # before any reader: kept for the first
    first = progress.episode_reader()
    log.add([2.0, 3.0], [6, 7])
    second = progress.episode_reader()  # at the oldest episode still held
    assert first.read() == [(1.0, 5), (2.0, 6), (3.0, 7)]
    assert first.read() == []
    log.add([4.0], [8])
    assert second.read() == [(1.0, 5), (2.0, 6), (3.0, 7), (4.0, 8)], "the first reader took nothing from it"
    assert first.read() == [(4.0, 8)]
    assert log.state_dict()["pending_episodes"] == []
    log.add([5.0], [9])
    first.read()
    assert log.state_dict()["pending_episodes"] == [[5.0, 9]], "the second has not read it yet"
    del second  # a reader gone holds nothing back
    first.read()
    log.add([6.0], [1])
    assert first.read() == [(6.0, 1)] and log.state_dict()["pending_episodes"] == []
    assert progress.episodes == 6


def test_the_log_state_keeps_the_checkpoint_keys_and_rewinds_its_readers() -> None:
    log = EpisodeLog()
    reader = log.reader()
    log.add([1.0, 2.0, 3.0], [4, 5, 6])
    reader.read()
    log.add([7.0], [8])
    state = log.state_dict()
    assert state == {"episodes": 4, "recent_returns": [1.0, 2.0, 3.0, 7.0], "pending_episodes": [[7.0, 8]]}
    resumed = EpisodeLog()
    early = resumed.reader()
    resumed.load_state_dict(state)
    assert early.read() == [(7.0, 8)] and resumed.count == 4
    # A checkpoint written before the pending episodes were saved has none.
    older = EpisodeLog()
    older.load_state_dict({"episodes": 3, "recent_returns": [1.0]})
    assert older.reader().read() == [] and older.count == 3


def test_marks_registered_through_the_view_are_the_budgets() -> None:
    progress, budget, _ = view(warmup=0)
    mark = Mark("frames", every=10)
    progress.register_mark(mark)
    budget.add(9)
    assert not progress.due(mark) and not budget.batch_end_due()
    budget.add(1)
    assert progress.due(mark) and budget.batch_end_due()


CARTPOLE = EnvConfig(id="CartPole-v1", num_envs=1)


def data_module(module_type: type = DQN, **kwargs) -> RLDataModule:
    """A CartPole DQN data module, set up (its replay built), outside any Trainer."""
    probe = make_env(CARTPOLE, num_envs=1)
    specs = probe.full_observation_spec.clone(), probe.full_action_spec["action"].clone()
    probe.close()
    replay, collect = ReplayConfig(device="cpu", batch_size=4), CollectConfig(total_frames=100)
    dm = RLDataModule(CARTPOLE, replay, collect, module_type(*specs), **kwargs)
    dm.setup("fit")
    return dm


def test_a_module_that_acts_at_batch_ends_gets_every_collections_batch_end() -> None:
    class Hooked(DQN):
        def on_train_batch_end(self, *args) -> None:
            pass

    assert not data_module().budget.batch_end_due()
    assert data_module(Hooked).budget.batch_end_due()


def test_the_replay_saved_by_the_data_module_is_loaded_by_a_new_one(tmp_path) -> None:
    saved = data_module()
    g = torch.Generator().manual_seed(0)
    rows = TensorDict(
        {
            "observation": torch.randn(8, 4, generator=g),
            "action": torch.randint(0, 2, (8, 2), generator=g),
            "next": {
                "observation": torch.randn(8, 4, generator=g),
                "reward": torch.randn(8, 1, generator=g),
                "terminated": torch.zeros(8, 1, dtype=torch.bool),
                "truncated": torch.zeros(8, 1, dtype=torch.bool),
                "done": torch.zeros(8, 1, dtype=torch.bool),
            },
        },
        batch_size=[8],
    )
    saved.replay.extend(rows)
    saved.save_replay(tmp_path / "last.ckpt.replay")
    state = saved.state_dict()

    resumed = data_module(resume_replay_from=tmp_path / "last.ckpt.replay")
    assert len(resumed.replay) == 0
    resumed.load_state_dict(state)  # as Lightning restores a checkpoint: the replay comes with it
    stored = resumed.replay.storage[: len(resumed.replay)]
    assert len(resumed.replay) == 8
    assert torch.equal(stored["observation"], rows["observation"])
    assert torch.equal(stored["next", "reward"], rows["next", "reward"])
