"""Robots as one batch through the data path: one policy call per env step, per-robot transitions as replay
rows, only those of robots active at the step, per-robot ends (marine navigation, 2 envs x 3 robots)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rl_lightning.algos.base import ReplayRequirements
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_run
from rl_lightning.data.ingest import Ingestion
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.agents import act_rows, agent_transitions, policy_specs
from rl_lightning.envs.factory import EnvConfig, make_env
from rl_lightning.envs.marinenav import Scenario
from rl_lightning.envs.marinenav import constants as C
from rl_lightning.envs.marinenav import core as marinenav_core

# Robot 0 starts within reach of its goal (done at the first step: the goal), robot 1 touching an obstacle
# (done at the first step: a collision), robot 2 far from its goal (runs to the timeout, 1001 steps).
SCENARIO = Scenario.make(
    starts=[(10.0, 10.0), (10.0, 30.0), (40.0, 45.0)],
    goals=[(11.0, 10.0), (45.0, 30.0), (40.0, 5.0)],
    headings=[0.0, 0.0, 0.0],
    obstacles=[(10.0, 32.0, 1.0)],
)
LEVEL = ["env.kwargs.schedule=null", "+env.kwargs.num_robots=3", "+env.kwargs.num_cores=0"]
LEVEL += ["+env.kwargs.num_obstacles=1"]
ENV_CFG = EnvConfig(
    id="MarineNav-v0",
    num_envs=2,
    kwargs={"schedule": None, "num_robots": 3, "num_cores": 0, "num_obstacles": 1},
)


@pytest.fixture
def fixed_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(marinenav_core, "generate", lambda rng, level: SCENARIO)


def test_the_policy_sees_one_robot_per_row_and_acts_once_for_all() -> None:
    env = make_env(ENV_CFG, seed=0)
    obs_spec, action_spec = policy_specs(env)
    assert obs_spec["observation"].shape == (6, C.OBS_DIM) and action_spec.shape == (6,)
    td = env.reset()
    calls = []

    def act(rows: TensorDict) -> TensorDict:
        calls.append(rows.batch_size)
        rows.set("action", torch.arange(6) % 25)
        rows.set("extra", torch.ones(6, 4))
        return rows

    act_rows(act, td, "agents")
    assert calls == [torch.Size([6])]
    assert td["agents", "action"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert td["agents", "extra"].shape == (2, 3, 4)
    # The rows are the robots' own observations, env-major.
    torch.testing.assert_close(
        td["agents", "observation"].reshape(6, -1)[4], td["agents", "observation"][1, 1]
    )

    # A collector hands the same TensorDict at every step: the next step's actions replace the last ones.
    def act_again(rows: TensorDict) -> TensorDict:
        rows.set("action", torch.arange(6).flip(0))
        return rows

    act_rows(act_again, td, "agents")
    assert td["agents", "action"].tolist() == [[5, 4, 3], [2, 1, 0]]


def test_a_robot_that_stops_leaves_the_others_running(fixed_scenario) -> None:
    env = make_env(ENV_CFG, seed=0, train=True)
    td = env.reset()
    assert td["agents", "mask"].all()
    td["agents", "action"] = torch.zeros(2, 3, dtype=torch.int64)
    td, root = env.step_and_maybe_reset(td)
    nxt = td["next", "agents"]
    # Robot 0 reached its goal, robot 1 collided: both terminated, with the goal's and the collision's reward.
    assert nxt["terminated"][..., 0].tolist() == [[True, True, False]] * 2
    assert not nxt["truncated"].any() and not td["next", "done"].any()
    r = nxt["reward"][0, :, 0]
    assert r[0] > C.GOAL_REWARD - 1 and -C.GOAL_REWARD < r[1] < C.COLLISION_PENALTY + 1
    # The next root's mask drops them; robot 2 goes on alone.
    assert root["agents", "mask"].tolist() == [[False, False, True]] * 2
    assert torch.equal(root["episode_reward"], nxt["reward"].sum(1))


def _batch(mask: list[list[bool]], terminated: list[list[bool]]) -> TensorDict:
    """A collected ``[E=1, T]`` batch of 2 robots with the given masks and per-robot ends."""
    T = len(mask)
    m = torch.tensor(mask).unsqueeze(0)  # [1, T, R]
    obs = torch.arange(T * 2, dtype=torch.float32).reshape(1, T, 2, 1).expand(1, T, 2, 3).clone()
    term = torch.tensor(terminated).reshape(1, T, 2, 1)
    agents = {"observation": obs, "action": torch.zeros(1, T, 2, dtype=torch.int64), "mask": m}
    nxt_agents = {
        "observation": obs + 100,
        "reward": torch.ones(1, T, 2, 1),
        "terminated": term,
        "truncated": torch.zeros_like(term),
        "done": term,
        "mask": m & ~term.squeeze(-1),
    }
    env_done = torch.zeros(1, T, 1, dtype=torch.bool)
    return TensorDict(
        {
            "agents": TensorDict(agents, [1, T, 2]),
            "next": TensorDict(
                {
                    "agents": TensorDict(nxt_agents, [1, T, 2]),
                    "done": env_done,
                    "episode_reward": torch.zeros(1, T, 1),
                    "step_count": torch.zeros(1, T, 1, dtype=torch.int64),
                },
                [1, T],
            ),
        },
        [1, T],
    )


class _Replay:
    def __init__(self) -> None:
        self.rows: list[TensorDict] = []

    def extend(self, rows: TensorDict) -> None:
        self.rows.append(rows)


def test_ingestion_keeps_only_active_robots_rows_and_n_step_stops_at_each_robots_end() -> None:
    # Robot 0 terminates at step 1 (inactive after it); robot 1 runs all 4 steps.
    mask = [[True, True], [True, True], [False, True], [False, True]]
    term = [[False, False], [True, False], [False, False], [False, False]]
    batch = _batch(mask, term)
    per_agent = agent_transitions(batch, "agents")
    assert per_agent.batch_size == (2, 4)  # [E * R, T]: each row one robot's steps in time order
    assert per_agent["mask"].tolist() == [[True, True, False, False], [True, True, True, True]]

    keys = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done"))
    needs = ReplayRequirements(sample_keys=keys, discount=0.5)
    ingestion = Ingestion(needs, NStepReturns(2, 0.5), DeviceCopies("cpu", "cpu"), agent_group="agents")
    replay = _Replay()
    ingestion.ingest(batch, replay, frames=0)
    (rows,) = replay.rows
    # Steps 0..2 are complete 2-step windows (step 3 waits for the next batch): robot 0's two active steps,
    # robot 1's three; robot 0's inactive step 2 is not a row.
    assert len(rows) == 5 and "mask" not in rows.keys()
    assert rows["observation"][:, 0].tolist() == [0.0, 2.0, 1.0, 3.0, 5.0]
    # Robot 0's window from step 0 runs into its end at step 1 (1 + 0.5), the one at step 1 is its end (1);
    # robot 1's windows run on (1 + 0.5).
    assert rows["next", "reward"][:, 0].tolist() == [1.5, 1.0, 1.5, 1.5, 1.5]
    assert rows["next", "done"][:, 0].tolist() == [True, True, False, False, False]
    assert rows["next", "observation"][:, 0].tolist() == [102.0, 102.0, 103.0, 105.0, 107.0]


@pytest.mark.slow
def test_a_tiny_iqn_fit_stores_each_active_robots_step_once(tmp_path: Path, fixed_scenario) -> None:
    frames, warmup = 2002, 220  # two episodes of 1001 steps (the timeout), side by side
    cfg = compose(
        [
            "+experiment=iqn_marinenav", "logger=none", "device=cpu", "progress_bar=false",
            f"total_frames={frames}", "env.num_envs=2", "env.eval_num_envs=1", *LEVEL,
            "collect.frames_per_batch=22", f"collect.warmup_frames={warmup}",
            "collect.updates_per_frame=0.01",
            "replay.batch_size=16", "algo.hidden_sizes=[16,16]", "algo.n_cos=8", "algo.n_policy_quantiles=4",
            "eval.every_frames=0", "eval.episodes=1", "checkpoint.every_frames=100000",
            f"run_dir={tmp_path / 'run'}",
        ]
    )  # fmt: skip
    run = build_run(cfg)
    module = run.module
    calls: list[torch.Size] = []
    act = module.act

    def counted(td):
        calls.append(td.batch_size)
        return act(td)

    module.act = counted
    run.trainer.fit(module, datamodule=run.datamodule)
    dm = run.datamodule
    assert dm.frames == frames and dm.episodes == 2
    # One policy call per env step after the warm-up (and the collector's probe of its policy at its start),
    # on all 6 robot slots at once.
    assert calls == [torch.Size([6])] * (1 + (frames - warmup) // 2)
    stored = dm.replay.storage[: len(dm.replay)]
    # Per env: robots 0 and 1 one step each (goal, collision), robot 2 all 1001 steps; no inactive rows.
    assert len(stored) == 2 * (2 + 1001)
    assert (stored["observation"].abs().sum(-1) > 0).all()
    # Terminal rows: each env's goal and collision once (robot 2's timeout is a truncation: it bootstraps).
    terminated = stored["next", "terminated"].reshape(-1)
    assert terminated.sum() == 4
    reward = stored["next", "reward"].reshape(-1)[terminated]
    assert (reward > C.GOAL_REWARD - 1).sum() == 2 and (reward < C.COLLISION_PENALTY + 1).sum() == 2
    # The evaluation ends the episode at the first collision (the public rule): a collision episode.
    assert run.trainer.callback_metrics["eval/collision_rate"] == 1.0
    assert np.isclose(float(run.trainer.callback_metrics["eval/success_rate"]), 0.0)
