"""Replay buffer: capacity wrap-around, PER priority updates, n-step returns."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rl_lightning.data.budget import FrameBudget
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.replay import TRAJ_KEY, ReplayConfig, make_replay_buffer
from rl_lightning.data.stream import ExperienceStream, UpdateRound
from rl_lightning.data.transfer import DeviceCopies


def items(start: int, n: int) -> TensorDict:
    i = torch.arange(start, start + n)
    return TensorDict({"i": i, "observation": i.float().unsqueeze(-1)}, batch_size=[n])


def test_capacity_wraps_around_overwriting_the_oldest():
    rb = make_replay_buffer(ReplayConfig(capacity=10, batch_size=4, device="cpu"))
    rb.extend(items(0, 7))
    rb.extend(items(7, 8))  # 15 written into 10 slots
    assert len(rb) == 10
    stored = rb.storage.get(torch.arange(10))["i"]
    assert sorted(stored.tolist()) == list(range(5, 15))
    assert stored[4].item() == 14  # the write cursor wrapped: item 10 went to slot 0, 14 to slot 4


def test_prioritized_sampler_reads_td_error_written_after_an_update():
    rb = make_replay_buffer(
        ReplayConfig(capacity=64, batch_size=16, device="cpu", prioritized=True, alpha=1.0)
    )
    rb.extend(items(0, 64))
    sample = rb.sample()
    assert "priority_weight" in sample.keys() and "index" in sample.keys()
    # One transition gets a huge TD error, the others a tiny one.
    hot = sample["index"][0].item()
    rb.update_priority(sample["index"], torch.where(sample["index"] == hot, 1000.0, 1e-3))
    counts = torch.zeros(64)
    for _ in range(20):
        counts += torch.bincount(rb.sample()["index"], minlength=64)
    assert counts[hot] > 0.5 * counts.sum()


def trajectory(rewards: list[float], end: int | None) -> TensorDict:
    t = len(rewards)
    done = torch.zeros(1, t, 1, dtype=torch.bool)
    if end is not None:
        done[0, end] = True
    return TensorDict(
        {
            "observation": torch.arange(t).float().view(1, t, 1),
            "next": {
                "observation": torch.arange(1, t + 1).float().view(1, t, 1),
                "reward": torch.tensor(rewards).view(1, t, 1),
                "done": done,
                "terminated": done.clone(),
                "truncated": torch.zeros_like(done),
            },
        },
        batch_size=[1, t],
    )


def test_n_step_returns_stop_at_a_terminal_inside_the_window():
    g = 0.9
    ns = NStepReturns(3, g)
    out = ns(trajectory([1, 2, 3, 4, 5, 6, 7, 8], end=4))
    r = out["next", "reward"].squeeze()
    assert out.shape == (1, 6)  # the last n-1 steps wait for the next batch
    expected = [
        1 + g * 2 + g * g * 3,
        2 + g * 3 + g * g * 4,
        3 + g * 4 + g * g * 5,
        4 + g * 5,
        5,
        6 + g * 7 + g * g * 8,
    ]
    assert torch.allclose(r, torch.tensor(expected))
    assert out["steps_to_next_obs"].squeeze().tolist() == [3, 3, 3, 2, 1, 3]
    # Windows that reach the terminal step are terminal: no bootstrap from the terminal observation.
    assert out["next", "terminated"].squeeze().tolist() == [False, False, True, True, True, False]
    assert out["next", "observation"].squeeze().tolist() == [3, 4, 5, 5, 5, 8]


def test_n_step_windows_continue_across_batches():
    g = 0.5
    ns = NStepReturns(3, g)
    first = ns(trajectory([1, 1, 1, 1], end=None))
    second = ns(trajectory([2, 2, 2, 2], end=None))
    assert first.shape[1] == 2 and second.shape[1] == 4
    # Step 2 of the first batch is completed with two rewards of the second.
    assert torch.isclose(second["next", "reward"][0, 0, 0], torch.tensor(1 + g * 1 + g * g * 2))
    assert second["steps_to_next_obs"][0, 0, 0] == 3


@pytest.mark.parametrize("steps", [4, 1], ids=["held-back-tail", "whole-batch-held"])
def test_n_step_windows_do_not_read_a_batch_the_collector_wrote_over(steps):
    # The local collector yields the same buffers at every collection: the held-back steps must be copies.
    g = 0.5
    rewards = (1.0, 2.0, 3.0)
    reused, ns, fresh = trajectory([rewards[0]] * steps, end=None), NStepReturns(3, g), NStepReturns(3, g)
    outs = [ns(reused)]
    for r in rewards[1:]:
        reused.update_(trajectory([r] * steps, end=None))  # the next collection, written in place
        outs.append(ns(reused))
    for out, r in zip(outs, rewards):
        expected = fresh(trajectory([r] * steps, end=None))
        assert out.shape == expected.shape
        assert torch.equal(out["next", "reward"], expected["next", "reward"])
    assert outs[-1].shape[1] > 0


def test_n_step_keeps_only_the_given_keys_with_the_same_transitions():
    """The ingestion passes the stored keys: the others are neither held back nor in the transitions, and
    the kept ones are those of a call with every key, across a batch boundary."""
    keys = ("observation", ("next", "observation"), ("next", "reward"), ("next", "terminated"))
    every, some = NStepReturns(3, 0.9), NStepReturns(3, 0.9)
    for rewards, end in (([1, 2, 3, 4], 2), ([5, 6, 7, 8], None)):
        full = every(trajectory(rewards, end))
        kept = some(trajectory(rewards, end), keys)
        assert set(kept.keys(True, True)) == {*keys, ("next", "done"), "steps_to_next_obs"}
        assert ("next", "truncated") in full.keys(True, True)
        for key in kept.keys(True, True):
            assert torch.equal(kept[key], full[key]), key


def test_n_step_one_is_identity():
    td = trajectory([1, 2, 3], end=1)
    out = NStepReturns(1, 0.9)(td)
    assert torch.equal(out["next", "reward"], td["next", "reward"])
    assert out["steps_to_next_obs"].eq(1).all()


def test_prioritized_sampling_follows_the_priorities_across_blocks():
    """Draws land on transition i with probability p_i / sum(p), p_i = (|td_i| + eps) ** alpha, whatever
    block the transition sits in; importance weights are (p_i / min p) ** -beta."""
    from rl_lightning.data.per import TensorPrioritizedSampler

    capacity, n = 1000, 700  # 300 slots unused: never drawn
    sampler = TensorPrioritizedSampler(capacity, alpha=0.5, beta=0.4, batch_size=64)
    assert 1 < sampler.block < capacity  # really two levels
    sampler.extend(torch.arange(n))
    g = torch.Generator().manual_seed(0)
    td = torch.rand(n, generator=g) * 4
    sampler.update_priority(torch.arange(n), td)
    expected = (td + sampler.eps) ** 0.5
    expected = expected / expected.sum()

    class Storage:
        def __len__(self) -> int:
            return n

    counts = torch.zeros(capacity)
    weights = {}
    for _ in range(400):
        index, info = sampler.sample(Storage(), 512)
        counts += torch.bincount(index, minlength=capacity).float()
        weights.update(zip(index.tolist(), info["priority_weight"].tolist()))
    assert counts[n:].sum() == 0
    freq = counts[:n] / counts.sum()
    assert (freq - expected).abs().max() < 0.0015  # 204,800 draws: a few standard errors
    p = (td + sampler.eps) ** 0.5
    i = max(weights, key=lambda k: p[k])
    assert weights[i] == pytest.approx(float((p[i] / p.min()) ** -0.4), rel=1e-5)
    # Saved and loaded, the sampler draws the same way.
    other = TensorPrioritizedSampler(capacity, alpha=0.5, beta=0.4, batch_size=64)
    other.load_state_dict(sampler.state_dict())
    assert torch.equal(other._block_sum, sampler._block_sum) and torch.equal(
        other._block_min, sampler._block_min
    )


class _Control:
    """The stream's control: a stop request once ``stop_after`` updates are done."""

    def __init__(self, budget: FrameBudget, stop_after: int | None) -> None:
        self.budget, self.stop_after, self.ended = budget, stop_after, False

    def stop_now(self, _: bool) -> bool:
        return self.stop_after is not None and self.budget.updates >= self.stop_after

    def aborting(self) -> bool:
        return False

    def end_fit(self) -> None:
        self.ended = True


def round_stream(replay, batch_size: int, owed: int = 10, stop_after: int | None = None) -> ExperienceStream:
    """An experience stream over a real replay buffer, with ``owed`` updates owed (no collector)."""
    budget = FrameBudget(total_frames=10**6, owed=owed)
    cpu = torch.device("cpu")
    return ExperienceStream(
        budget, None, replay, DeviceCopies(cpu, cpu), batch_size, start=None, stop_collection=None,
        control=_Control(budget, stop_after),
    )  # fmt: skip


def trajectories(steps: int, num_envs: int, length: int = 25) -> TensorDict:
    """``steps`` steps of each of ``num_envs`` envs written env after env per step, episodes of ``length``."""
    t = torch.arange(steps).unsqueeze(1).expand(steps, num_envs).reshape(-1)
    env = torch.arange(num_envs).repeat(steps)
    step = t % length
    n = steps * num_envs
    return TensorDict(
        {
            "i": torch.arange(n),
            "observation": torch.randn(n, 1),
            "step_count": step.unsqueeze(-1),
            TRAJ_KEY: (t // length) * num_envs + env,
            "next": {"done": (step == length - 1).unsqueeze(-1)},
        },
        [n],
    )


@pytest.mark.parametrize("kind", ["uniform", "slices", "interleaved_slices", "prioritized"])
def test_a_round_draws_its_samples_at_once_and_prioritized_ones_one_by_one(kind, monkeypatch):
    slice_len = 3 if "slices" in kind else None
    cfg = ReplayConfig(capacity=1000, batch_size=12, prioritized=kind == "prioritized", slice_len=slice_len)
    replay = make_replay_buffer(cfg, interleaved=kind == "interleaved_slices")
    replay.extend(trajectories(500, 1) if kind == "slices" else trajectories(250, 2))
    calls = []
    sample = replay.sample
    monkeypatch.setattr(replay, "sample", lambda *a, **k: calls.append(a) or sample(*a, **k))
    stream = round_stream(replay, 12)
    samples = [s.clone() for s in UpdateRound(stream, 6)]
    assert len(samples) == 6 and all(s.batch_size == (12,) for s in samples)
    assert calls == ([()] * 6 if kind == "prioritized" else [(72,)])
    assert stream.budget.updates == 6 and stream.budget.owed == 4
    rows = torch.cat([s["i"] for s in samples])
    assert rows.unique().numel() > 50  # 72 draws with replacement from 500 rows: not one sample repeated
    if slice_len:  # each sample is whole slices: consecutive steps of one trajectory
        for s in samples:
            traj, step = s[TRAJ_KEY].view(4, slice_len), s["step_count"].view(4, slice_len)
            assert (traj == traj[:, :1]).all() and (step.diff(dim=1) == 1).all()
    # A stop request ends a round drawn one by one between updates, the rest owed; a round drawn at once
    # runs to its end (a stop between its updates would leave the rest of the draw behind), and a stop
    # before it does none of it.
    stream = round_stream(replay, 12, stop_after=2)
    done = len(list(UpdateRound(stream, 6)))
    assert done == (2 if kind == "prioritized" else 6) and stream.budget.owed == 10 - done
    stream = round_stream(replay, 12, stop_after=0)
    assert len(list(UpdateRound(stream, 6))) == 0 and stream.budget.owed == 10 and stream.control.ended


@pytest.mark.parametrize("num_envs", [1, 8])
def test_slices_drawn_in_rounds_have_the_distribution_of_slices_drawn_one_by_one(num_envs):
    """Two-sample chi-square over the slices' first rows: a round's samples and separate samples come from one
    distribution (a round drawing from part of the buffer, or repeating slices, puts it far above 1)."""
    torch.manual_seed(0)
    cfg = ReplayConfig(capacity=1000, batch_size=12, slice_len=3)
    replay = make_replay_buffer(cfg, interleaved=num_envs > 1)
    replay.extend(trajectories(600 // num_envs, num_envs, length=37))
    rounds = 300
    alone = torch.cat([replay.sample()["i"][::3] for _ in range(8 * rounds)])
    stream = round_stream(replay, 12, owed=8 * rounds)
    together = torch.cat([s["i"][::3] for _ in range(rounds) for s in UpdateRound(stream, 8)])
    a, b = (torch.bincount(x, minlength=600).double() for x in (alone, together))
    seen = (a + b) > 0
    chi2 = ((a - b) ** 2 / (a + b))[seen].sum().item()
    assert chi2 / (seen.sum().item() - 1) < 1.3
