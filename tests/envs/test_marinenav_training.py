"""Marine navigation through the CLI: the presets fit, evaluate reports the public evaluation's outcome
rates with Wilson intervals, risk-sensitive for IQN (CVaR), and videos draw the scene."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.cli import run_main
from omegaconf import OmegaConf

from rl_lightning.cli import compose
from rl_lightning.cli.evaluate import outcome_intervals, set_risk
from rl_lightning.cli.run import build_module, env_config
from rl_lightning.envs.factory import EnvConfig, make_env
from rl_lightning.envs.marinenav import MarineNavEnv, Scenario
from rl_lightning.envs.marinenav.render import OBSTACLE, PALETTE
from rl_lightning.training.stats import wilson
from rl_lightning.training.video import record_video

OUTCOME = re.compile(r"^  (success|collision|timeout)\s+([0-9.]+)  \[([0-9.]+), ([0-9.]+)\]  \(Wilson 95%\)$")


def test_outcome_lines_carry_wilson_intervals_of_the_episodes() -> None:
    stats = {"return_mean": 1.0, "success_rate": 0.7, "collision_rate": 0.2, "timeout_rate": 0.1}
    lines = outcome_intervals(stats, 10)
    assert [OUTCOME.match(line).group(1) for line in lines] == ["success", "collision", "timeout"]
    w = wilson(7, 10)
    assert (stats["success_rate_low"], stats["success_rate_high"]) == (w["low"], w["high"])
    assert 0.39 < w["low"] < 0.40 and 0.89 < w["high"] < 0.90  # Wilson's 7/10: [0.397, 0.892]
    assert outcome_intervals({"return_mean": 1.0}, 10) == []


def test_risk_applies_to_iqn_and_is_refused_for_aciqn() -> None:
    iqn = OmegaConf.create({"algo": {"_target_": "rl_lightning.algos.quantile.IQN", "risk": "neutral"}})
    iqn.algo.risk_param = 0.0
    set_risk(iqn, OmegaConf.create({"risk": "cvar", "risk_param": 0.25}))
    assert (iqn.algo.risk, iqn.algo.risk_param) == ("cvar", 0.25)
    with pytest.raises(ValueError, match="tail fraction"):
        set_risk(iqn, OmegaConf.create({"risk": None, "risk_param": 1.5}))
    aciqn = OmegaConf.create({"algo": {"_target_": "rl_lightning.algos.quantile.ACIQN", "risk": "neutral"}})
    with pytest.raises(ValueError, match="ACIQN does not act with one"):
        set_risk(aciqn, OmegaConf.create({"risk": "cvar", "risk_param": 0.25}))


def test_evaluation_envs_take_the_levels_in_turn_and_end_at_the_first_collision() -> None:
    schedule = {
        "timesteps": [0, 10, 20],
        "num_robots": [3, 4, 5],
        "num_cores": [0, 0, 0],
        "num_obstacles": [0, 0, 2],
        "min_start_goal_dis": [30.0, 35.0, 40.0],
    }
    cfg = EnvConfig(id="MarineNav-v0", num_envs=3, kwargs={"schedule": schedule})
    ev = make_env(cfg, seed=0)
    ev.reset()
    assert ev.sim.present.sum(1).tolist() == [3, 4, 5] and ev.sim.end_on_collision
    train = make_env(cfg, seed=0, train=True, frames=25)  # a resumed run 25 frames in: the last level
    train.reset()
    assert train.sim.present.sum(1).tolist() == [5, 5, 5] and not train.sim.end_on_collision


def _outcomes(stdout: str) -> dict[str, tuple[float, float, float]]:
    found = {}
    for line in stdout.splitlines():
        m = OUTCOME.match(line)
        if m:
            found[m.group(1)] = tuple(float(x) for x in m.groups()[1:])
    return found


@pytest.mark.slow
def test_the_cpu_preset_fits_and_evaluate_prints_outcome_rates(tmp_path: Path) -> None:
    fit = run_main(
        tmp_path, "fit", "+experiment=aciqn_marinenav_cpu", "total_frames=2000", "progress_bar=false",
        "eval.episodes=3", "device=cpu",
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    out = json.loads(fit.stdout.strip().splitlines()[-1])
    assert out["frames"] == 2000 and "eval/return_mean" in out
    ev = run_main(tmp_path, "evaluate", f"ckpt={out['last_ckpt']}", "episodes=6", "logger=none")
    assert ev.returncode == 0, ev.stderr[-3000:]
    rates = _outcomes(ev.stdout)
    assert set(rates) == {"success", "collision", "timeout"}
    assert sum(v for v, _, _ in rates.values()) == pytest.approx(1.0, abs=2e-3)  # exclusive outcomes
    for value, low, high in rates.values():
        assert low <= value <= high and high - low > 0.2  # 6 episodes: wide intervals
    summary = json.loads(ev.stdout.strip().splitlines()[-1])
    assert summary["collision_rate_low"] <= summary["collision_rate"] <= summary["collision_rate_high"]
    refused = run_main(tmp_path, "evaluate", f"ckpt={out['last_ckpt']}", "risk=cvar", "risk_param=0.5")
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_an_iqn_checkpoint_evaluates_risk_averse(tmp_path: Path) -> None:
    fit = run_main(
        tmp_path, "fit", "+experiment=iqn_marinenav_cpu", "total_frames=640", "collect.warmup_frames=320",
        "progress_bar=false", "logger=none", "eval.episodes=3", "device=cpu", "algo.hidden_sizes=[32,32]",
    )  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-3000:]
    ckpt = json.loads(fit.stdout.strip().splitlines()[-1])["last_ckpt"]
    ev = run_main(
        tmp_path, "evaluate", f"ckpt={ckpt}", "episodes=3", "logger=none", "risk=cvar", "risk_param=0.1"
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    assert "[acting cvar(0.1)]" in ev.stdout and set(_outcomes(ev.stdout)) == {
        "success",
        "collision",
        "timeout",
    }
    state = torch.load(tmp_path / ckpt, weights_only=False)
    assert state["hyper_parameters"]["risk"] == "neutral"  # the checkpoint itself is left as trained


def test_a_frame_draws_vessels_goals_obstacles_and_currents() -> None:
    scenario = Scenario.make(
        starts=[(10.0, 10.0), (40.0, 40.0)],
        goals=[(45.0, 10.0), (10.0, 45.0)],
        headings=[0.0, 0.0],
        obstacles=[(25.0, 40.0, 1.0)],
        cores=[(30.0, 20.0, 1.0, 3 * math.pi)],
    )
    env = MarineNavEnv(schedule=None, num_robots=2, num_cores=1, num_obstacles=1, render_mode="rgb_array")
    env.reset(seed=0, options={"scenario": scenario})
    frame = env.render()
    assert frame.shape == (440, 440, 3) and frame.dtype == np.uint8

    def pixel(x: float, y: float) -> tuple[int, ...]:
        return tuple(int(v) for v in frame[439 - int(y * 8), int(x * 8)])

    assert pixel(10.0 + 1.0, 10.0 - 1.0) == PALETTE[0] and pixel(40.0 - 1.0, 40.0 - 1.0) == PALETTE[1]
    assert pixel(25.0, 40.0) == OBSTACLE
    assert pixel(45.0 + 1.9, 10.0) == PALETTE[0] and pixel(45.0, 10.0) != PALETTE[0]  # the goal's ring
    water_far, water_near = np.array(pixel(5.0, 50.0)), np.array(pixel(31.2, 21.2))
    assert water_near.sum() < water_far.sum() - 60  # darker where the current runs fast
    assert MarineNavEnv(schedule=None, num_robots=2).render() is None


def test_a_video_plays_every_robot_through_one_policy(tmp_path: Path) -> None:
    pytest.importorskip("imageio")
    cfg = compose(["+experiment=iqn_marinenav_cpu", "device=cpu", "algo.hidden_sizes=[16,16]"])
    env_cfg = env_config(cfg)
    module = build_module(cfg, env_config(cfg))
    calls = []
    act_eval = module.act_eval

    def counted(td):
        calls.append(td.batch_size)
        return act_eval(td)

    module.act_eval = counted
    path = record_video(module, env_cfg, tmp_path / "v.gif", episodes=1, seed=0, max_frames=6)
    frames = pytest.importorskip("imageio.v3").imread(path, index=None)
    assert frames.shape[1:] == (440, 440, 3) and len(frames) == 6
    assert calls == [torch.Size([5])] * 5  # the 5 robot slots of the curriculum, one call per step


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("collect.workers=2", "has several agents per env"),
        ("env.vectorization=async", "batches its envs itself"),
        ("+env.kwargs.foo=1", "are not marine-navigation options"),
    ],
)
def test_what_the_agent_data_path_cannot_do_is_one_line(tmp_path: Path, override: str, message: str) -> None:
    out = run_main(tmp_path, "fit", "+experiment=aciqn_marinenav_cpu", "logger=none", "device=cpu", override)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and message in lines[0]
    assert not (tmp_path / "runs").exists()
