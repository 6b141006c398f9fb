"""The on-policy data path: a rollout buffer consumed in epochs of shuffled minibatches, the budget's grant
per collection, the early stop on the approximate KL, and a saved position that resumes the same
minibatches; then the whole path through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import SMOKE, run_main
from tensordict import TensorDict

from rl_lightning.data.budget import FrameBudget
from rl_lightning.data.rollout import RolloutBuffer


def rollout(n: int = 2, t: int = 6) -> TensorDict:
    rows = torch.arange(n * t).reshape(n, t)
    return TensorDict({"row": rows, "x": torch.randn(n, t, 3)}, batch_size=[n, t])


def test_each_pass_draws_every_row_once_in_a_new_order_after_the_rollout_is_prepared() -> None:
    prepared = []
    buffer = RolloutBuffer(lambda td: prepared.append(td.batch_size), epochs=3, minibatches=4)
    buffer.extend_rollout(rollout())
    assert prepared == [torch.Size([2, 6])] and len(buffer) == 12
    passes = [torch.cat([buffer.sample()["row"] for _ in range(4)]) for _ in range(3)]
    for drawn in passes:
        assert sorted(drawn.tolist()) == list(range(12))
    assert not torch.equal(passes[0], passes[1]) or not torch.equal(passes[1], passes[2])
    assert buffer.epoch == 3


def test_the_rows_keep_the_declared_keys_and_each_minibatch_gathers_the_same_values() -> None:
    def prepare(td: TensorDict) -> None:
        td.set("advantage", td.get("x").sum(-1))

    full = rollout(3, 4)
    full.set(("next", "x"), torch.randn(3, 4, 3))
    keys = ("row", "advantage", ("next", "x"))
    buffer = RolloutBuffer(prepare, epochs=1, minibatches=2, keys=keys)
    buffer.extend_rollout(full)
    assert set(buffer.rows.keys(True, True)) == {"row", "advantage", ("next", "x")}  # "x" left behind
    torch.manual_seed(0)
    first = buffer.sample()
    torch.manual_seed(0)
    idx = torch.randperm(12).tensor_split(2)[0]
    expected = full.reshape(-1)[idx]
    assert first.batch_size == (6,) and first["next"].batch_size == (6,)
    for key in keys:
        assert torch.equal(first[key], expected[key])
    with pytest.raises(KeyError, match=r"sample_keys name \['value'\]"):
        RolloutBuffer(prepare, epochs=1, minibatches=2, keys=("row", "value")).extend_rollout(rollout())


def test_a_pass_ending_above_the_target_kl_forfeits_the_rest() -> None:
    buffer = RolloutBuffer(lambda td: None, epochs=4, minibatches=2, target_kl=0.01)
    buffer.extend_rollout(rollout())
    high, low = TensorDict({"approx_kl": torch.tensor(0.5)}), TensorDict({"approx_kl": torch.tensor(0.001)})
    buffer.sample()
    assert not buffer.observe(high)  # mid-pass: not checked
    buffer.sample()
    assert not buffer.observe(low)  # a pass ended below the target
    buffer.sample(), buffer.sample()
    assert buffer.observe(high)  # the second pass ended above it
    budget = FrameBudget(total_frames=100, updates_per_collection=8)
    assert budget.add(12) == 8 and budget.owed == 8
    budget.forfeit()
    assert budget.owed == 0


def test_the_saved_position_resumes_the_same_minibatches(tmp_path: Path) -> None:
    torch.manual_seed(0)
    buffer = RolloutBuffer(lambda td: None, epochs=2, minibatches=3)
    buffer.extend_rollout(rollout())
    buffer.sample()
    buffer.dumps(tmp_path / "replay")
    state = torch.get_rng_state()
    expected = [buffer.sample()["row"] for _ in range(5)]
    restored = RolloutBuffer(lambda td: None, epochs=2, minibatches=3)
    restored.loads(tmp_path / "replay")
    torch.set_rng_state(state)
    assert [restored.sample()["row"].tolist() for _ in range(5)] == [e.tolist() for e in expected]
    assert json.loads((tmp_path / "replay" / "position.json").read_text()) == {"epoch": 0, "cursor": 1}


def test_a_short_rollout_keeps_the_minibatch_size_and_forfeits_the_updates_beyond_its_passes() -> None:
    # A whole rollout is 2 x 6 = 12 rows in 4 minibatches of 3; the run's last collection has 2 x 3 rows.
    buffer = RolloutBuffer(lambda td: None, epochs=2, minibatches=4, rollout_rows=12)
    buffer.extend_rollout(rollout(2, 3))
    assert buffer.minibatches == 2
    done = TensorDict({"approx_kl": torch.tensor(0.0)})
    sizes, forfeits = [], []
    for _ in range(4):  # the two passes of two minibatches
        sizes.append(len(buffer.sample()))
        forfeits.append(buffer.observe(done))
    assert sizes == [3, 3, 3, 3] and forfeits == [False, False, False, True]
    buffer.extend_rollout(rollout(2, 6))  # a whole one again: its passes use every granted update
    assert buffer.minibatches == 4
    for _ in range(8):
        buffer.sample()
        assert not buffer.observe(done)
    buffer.extend_rollout(rollout(1, 1))  # never fewer than one minibatch
    assert buffer.minibatches == 1 and len(buffer.sample()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("target_kl", [None, 1e-6])
def test_ppo_through_the_cli_does_its_passes_per_rollout_or_stops_them_at_the_target_kl(
    tmp_path: Path, target_kl: float | None
) -> None:
    # 4 envs x 16 steps = 64 frames a rollout; 2 rollouts and a last one of 32 frames (8 steps, cut to end
    # at total_frames); 2 epochs of 4 minibatches each, of 2 on the last one.
    args = ["fit", "algo=ppo", "env=cartpole", "env.num_envs=4", "algo.rollout_steps=16", "algo.epochs=2",
            "algo.minibatches=4", "algo.lr=0.01", "algo.anneal_lr=false", "total_frames=160", "logger=none",
            *SMOKE]  # fmt: skip
    if target_kl is not None:
        args.append(f"algo.target_kl={target_kl}")
    out = run_main(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    # Four Adam steps of 0.01 move the policy far past an approximate KL of 1e-6: one pass per rollout.
    assert summary["frames"] == 160
    assert summary["updates"] == (2 * 8 + 4 if target_kl is None else 2 * 4 + 2)
