"""What a TD-MPC2 hockey checkpoint's reward head and critics know of goals, read along games its prior plays.

    python benchmarks/tdmpc2_goal_check.py LABEL=CKPT [LABEL=CKPT ...] [--games 30] [--opponent weak]
        [--out tdmpc2_goal_check]

For each checkpoint the policy prior (its mean action, as ``evaluate`` plays it) plays ``--games`` NORMAL
games. At every step the script reads the reward head's prediction for the action taken and ``Q(z, a)`` (the
mean of two critics, as the prior's objective reads them) at the encoded observation, and sets them beside
the reward that followed and the discounted return from that step on (with the checkpoint's discount):

- ``reward_on_goal_steps``: the mean prediction on the steps that scored (+10 received) and conceded (-10);
  a model that has learned goals predicts about +10 and -10 there;
- ``q_vs_return``: the correlation of ``Q`` with the return that followed, and the mean ``Q`` per band of
  that return: a critic that tells a scoring position from a conceding one rises across the bands.

A goal's transition is the last step of its episode, so a slice of ``H`` steps that must lie inside one
episode holds it only in its last place: the reward and the value of a goal are then learned only on
latents rolled out ``H - 1`` steps, with the weight ``rho ** (H - 1)`` (``docs/hockey.md``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import write
from omegaconf import OmegaConf

from rl_lightning.cli.run import restore_module
from rl_lightning.envs.hockey import HockeyVsOpponentEnv
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

#: Bands of the discounted return that followed a step (a goal pays 10).
BANDS = ((-np.inf, -3.0), (-3.0, -0.5), (-0.5, 0.5), (0.5, 3.0), (3.0, np.inf))
SEED = 500  # the games' first seed; game i plays SEED + i


@torch.no_grad()
def check(path: Path, games: int, opponent: str) -> dict[str, Any]:
    """Plays ``games`` games with the checkpoint's prior and reads its reward head and critics."""
    ckpt = load_checkpoint(str(path))
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    module = restore_module(ckpt, saved)
    model, gamma = module.model, float(module.discount)
    env = HockeyVsOpponentEnv(opponent=opponent)
    predicted, values, rewards, returns, winners = [], [], [], [], []
    for game in range(games):
        obs, _ = env.reset(seed=SEED + game)
        episode_rewards, done = [], False
        while not done:
            z = model.encode(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))
            action = model.pi(z).mean
            predicted.append(float(model.predict_reward(z, action)))
            values.append(float(model.Q(z, action, "avg")))
            obs, reward, terminated, truncated, info = env.step(module.actions.to_env(action)[0].numpy())
            episode_rewards.append(reward)
            done = terminated or truncated
        following, episode_returns = 0.0, []
        for reward in reversed(episode_rewards):
            following = reward + gamma * following
            episode_returns.append(following)
        returns += episode_returns[::-1]
        rewards += episode_rewards
        winners.append(int(info["winner"]))
    predicted, values, rewards, returns = map(np.asarray, (predicted, values, rewards, returns))
    scored, conceded = rewards > 5, rewards < -5
    return {
        "checkpoint": str(path),
        "frames": int(ckpt["RLDataModule"]["frames"]),
        "horizon": int(saved.algo.horizon),
        "discount": round(gamma, 5),
        "games": games,
        "opponent": opponent,
        "win_loss_draw": [winners.count(1), winners.count(-1), winners.count(0)],
        "reward_on_goal_steps": {
            "scored": {"steps": int(scored.sum()), "predicted_mean": _mean(predicted[scored])},
            "conceded": {"steps": int(conceded.sum()), "predicted_mean": _mean(predicted[conceded])},
            "other_steps_abs_error": _mean(np.abs(predicted - rewards)[~(scored | conceded)]),
        },
        "q_vs_return": {
            "correlation": round(float(np.corrcoef(values, returns)[0, 1]), 3),
            "bands": [
                {
                    "return_from": _bound(lo),
                    "return_to": _bound(hi),
                    "steps": int(s.sum()),
                    "q_mean": _mean(values[s]),
                }
                for lo, hi in BANDS
                if (s := (returns >= lo) & (returns < hi)).any()
            ],
        },
    }


def _mean(x: np.ndarray) -> float | None:
    return round(float(x.mean()), 3) if x.size else None


def _bound(x: float) -> float | None:
    """A band's end for JSON: ``None`` where the band is open."""
    return None if np.isinf(x) else x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="LABEL=PATH of TD-MPC2 hockey checkpoints")
    parser.add_argument("--games", type=int, default=30)
    parser.add_argument("--opponent", default="weak", choices=("weak", "strong"))
    parser.add_argument("--out", default="tdmpc2_goal_check")
    args = parser.parse_args()
    pairs = [item.split("=", 1) for item in args.checkpoints]
    if any(len(p) != 2 for p in pairs):
        parser.exit(2, "tdmpc2_goal_check: name each checkpoint as LABEL=PATH.\n")
    torch.set_num_threads(1)
    results = {}
    for label, path in pairs:
        results[label] = check(Path(path), args.games, args.opponent)
        print(label, results[label]["reward_on_goal_steps"], results[label]["q_vs_return"]["correlation"])
    write(args.out, {"checkpoints": results})


if __name__ == "__main__":
    main()
