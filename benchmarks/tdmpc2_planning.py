"""Why a TD-MPC2 checkpoint plans better or worse than its policy prior: calibration and planner settings.

    python benchmarks/tdmpc2_planning.py LABEL=CKPT [LABEL=CKPT ...] [--games 20] [--sweep-games 20]
        [--sweep NAME ...] [--out tdmpc2_planning]
    python benchmarks/tdmpc2_planning.py --goals LABEL=CKPT [LABEL=CKPT ...] [--games 30] [--opponent weak]
        [--out tdmpc2_goal_check]

For each checkpoint, on each of its evaluation scenarios (hockey: the weak and the strong opponent; other
envs: the env itself), on episodes of their own (seeds from 700000, apart from validation and test):

- ``calibration``: the prior (its mean action) and the planner (eval mode, as ``evaluate plan=true``)
  each play ``--games`` episodes. At every step both actions are scored by the planner's objective
  (``sum_t γ^t r̂_t + γ^H Q_avg(z_H, π(z_H))`` over the horizon, of the plan's mean sequence and of the
  prior's mean actions along the model's rollout) and by the critics at the encoded observation
  (``Q_avg(z, a)``), and set beside the discounted return that followed in the env: how much each
  estimate over-states the return of the actions taken, on which share of steps the objective ranks the
  plan above the prior, how far the plan's action lies from the prior's, the reward head's one-step error
  and the latent dynamics' error after 1 to 3 steps along the actions taken (against the encoder's latent
  of the observation reached).
- ``sweep``: the planner's settings changed one at a time (horizon, iterations, samples, elites,
  temperature, the share of prior trajectories, the initial std, the reference's sampled elite in eval
  mode): the return, and at hockey the win, loss and draw rates, over ``--sweep-games`` episodes each.

``--goals``: what a hockey checkpoint's reward head and critics know of goals, read along games its prior
plays. For each checkpoint the policy prior (its mean action, as ``evaluate`` plays it) plays
``--games`` NORMAL games. At every step the script reads the reward head's prediction for the action taken
and ``Q(z, a)`` (the mean of two critics, as the prior's objective reads them) at the encoded observation,
and sets them beside the reward that followed and the discounted return from that step on (with the
checkpoint's discount):

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
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _common import write
from omegaconf import OmegaConf

from rl_lightning.algos.tdmpc2.planner import MPPIPlanner, PlannerSettings
from rl_lightning.cli.run import container, env_config, restore_module
from rl_lightning.envs.factory import make_gym_env
from rl_lightning.envs.hockey import HockeyVsOpponentEnv
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

#: The episodes' first seed (episode i plays SEED + i): apart from the validation and test seeds.
SEED = 700_000
#: Planner settings tried one at a time (keyword arguments of MPPIPlanner over the checkpoint's own).
SWEEP: dict[str, dict[str, Any]] = {
    "as trained": {},
    "sampled elite (the reference's eval)": {"eval_sample_elite": True},
    "horizon 3": {"horizon": 3},
    "iterations 6": {"iterations": 6},
    "samples 256": {"num_samples": 256},
    "elites 32": {"num_elites": 32},
    "temperature 0.1": {"temperature": 0.1},
    "temperature 2": {"temperature": 2.0},
    "half prior trajectories": {"num_pi_trajs": "half"},
    "max_std 0.5": {"max_std": 0.5},
}


@dataclasses.dataclass
class Checkpoint:
    """A restored TD-MPC2 checkpoint with what playing it needs."""

    module: Any
    saved: Any
    frames: int

    @property
    def model(self) -> Any:
        return self.module.model

    def planner(self, **changes: Any) -> MPPIPlanner:
        hp = dict(self.module.hparams)
        args = {k: hp[k] for k in ("horizon", "iterations", "num_samples", "num_pi_trajs", "num_elites",
                                   "temperature", "min_std", "max_std", "eval_sample_elite")}  # fmt: skip
        args.update(changes)
        if args["num_pi_trajs"] == "half":
            args["num_pi_trajs"] = args["num_samples"] // 2
        args["num_elites"] = min(args["num_elites"], args["num_samples"])
        settings = PlannerSettings(**args)
        return MPPIPlanner(
            self.module.action_dim, num_envs=1, discount=float(self.module.discount), settings=settings
        )

    def scenarios(self) -> dict[str, Callable[[], Any]]:
        """Each evaluation scenario's gymnasium env maker (hockey: one per opponent variant)."""
        env_cfg = env_config(self.saved)
        variants = container(self.saved.eval.variants) or {"env": {}}
        return {
            name: (lambda kw=kw: make_gym_env(dataclasses.replace(env_cfg, kwargs={**env_cfg.kwargs, **kw})))
            for name, kw in variants.items()
        }


def restore(path: Path) -> Checkpoint:
    ckpt = load_checkpoint(str(path))
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    module = restore_module(ckpt, saved)
    module.model.eval()
    return Checkpoint(module, saved, int(ckpt["RLDataModule"]["frames"]))


def prior_sequence(ck: Checkpoint, z: torch.Tensor, horizon: int) -> torch.Tensor:
    """``[H, 1, A]``: the prior's mean actions along the model's own rollout from ``z``."""
    actions = []
    for _ in range(horizon):
        actions.append(ck.model.pi(z).mean)
        z = ck.model.next(z, actions[-1])
    return torch.stack(actions)


def objective(ck: Checkpoint, planner: MPPIPlanner, z: torch.Tensor, actions: torch.Tensor) -> float:
    """The planner's score of an action sequence ``[H, 1, A]`` from ``z``."""
    return float(planner.estimate_value(ck.model, z, actions))


@torch.no_grad()
def play(ck: Checkpoint, make: Callable[[], Any], games: int, planner: MPPIPlanner | None,
         record: bool = False) -> dict[str, Any]:  # fmt: skip
    """``games`` episodes acting with ``planner`` (eval mode) or, with ``None``, the prior's mean action;
    with ``record`` the per-step estimates of :func:`calibrate`."""
    model, gamma, to_env = ck.model, float(ck.module.discount), ck.module.actions.to_env
    scorer = planner or ck.planner()
    env = make()
    returns, winners, steps = [], [], []
    torch.manual_seed(SEED)
    for game in range(games):
        obs, _ = env.reset(seed=SEED + game)
        if planner is not None:
            planner.reset()
        rewards, done, t, rows = [], False, 0, []
        while not done:
            z = model.encode(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))
            prior = model.pi(z).mean
            action = (
                prior if planner is None else planner(model, z, t0=torch.tensor([t == 0]), eval_mode=True)
            )
            if record:  # the plan's mean sequence (its first action is what eval mode executes)
                plan = action if planner is not None else scorer(model, z, t0=torch.tensor([t == 0]),
                                                                 eval_mode=True)  # fmt: skip
                plan_value = objective(ck, scorer, z, scorer.prev_mean.transpose(0, 1))
                prior_value = objective(ck, scorer, z, prior_sequence(ck, z, scorer.horizon))
                rows.append({
                    "z": z, "action": action,
                    "objective_taken": prior_value if planner is None else plan_value,
                    "objective_plan": plan_value,
                    "objective_prior": prior_value,
                    "q_taken": float(model.Q(z, action, "avg")),
                    "q_plan": float(model.Q(z, plan, "avg")),
                    "q_prior": float(model.Q(z, prior, "avg")),
                    "distance": float((plan - prior).abs().mean()),
                    "reward_predicted": float(model.predict_reward(z, action)),
                })  # fmt: skip
            obs, reward, terminated, truncated, info = env.step(to_env(action)[0].numpy())
            rewards.append(float(reward))
            done, t = terminated or truncated, t + 1
        following, discounted = 0.0, []
        for reward in reversed(rewards):
            following = reward + gamma * following
            discounted.append(following)
        if record:
            for row, ret, reward in zip(rows, discounted[::-1], rewards, strict=True):
                row.update(return_following=ret, reward=reward)
            steps.append(rows)
        returns.append(sum(rewards))
        if "winner" in info:
            winners.append(int(info["winner"]))
    out: dict[str, Any] = {"games": games, "return_mean": round(float(np.mean(returns)), 3)}
    if winners:
        out.update({f"{k}_rate": round(sum(w == v for w in winners) / games, 3)
                    for k, v in (("win", 1), ("loss", -1), ("draw", 0))})  # fmt: skip
    if record:
        out["steps"] = steps
    return out


def latent_errors(ck: Checkpoint, episodes: list[list[dict[str, Any]]], k_max: int = 3) -> dict[str, float]:
    """The dynamics' squared latent error after ``k`` steps along the actions taken, against the encoder's
    latent there (the consistency loss's quantity), for ``k`` = 1 to ``k_max``."""
    model, errors = ck.model, {k: [] for k in range(1, k_max + 1)}
    for rows in episodes:
        for t in range(len(rows)):
            z = rows[t]["z"]
            for k in range(1, k_max + 1):
                if t + k >= len(rows):
                    break
                z = model.next(z, rows[t + k - 1]["action"])
                errors[k].append(float((z - rows[t + k]["z"]).pow(2).mean()))
    return {f"after_{k}": round(float(np.mean(v)), 5) for k, v in errors.items() if v}


def _mean(x: list[float]) -> float:
    return round(float(np.mean(x)), 3)


@torch.no_grad()
def calibrate(ck: Checkpoint, make: Callable[[], Any], games: int) -> dict[str, Any]:
    """Both acting modes with their per-step estimates against the returns that followed."""
    out = {}
    for mode, planner in (("prior", None), ("plan", ck.planner())):
        played = play(ck, make, games, planner, record=True)
        episodes = played.pop("steps")
        rows = [r for rows in episodes for r in rows]
        col = {k: [r[k] for r in rows] for k in rows[0] if k not in ("z", "action")}
        ret = np.array(col["return_following"])
        out[mode] = {
            **played,
            "steps": len(rows),
            "return_following_mean": _mean(col["return_following"]),
            "objective_taken_minus_return": _mean(np.array(col["objective_taken"]) - ret),
            "q_taken_minus_return": _mean(np.array(col["q_taken"]) - ret),
            "objective_plan_mean": _mean(col["objective_plan"]),
            "objective_prior_mean": _mean(col["objective_prior"]),
            "q_plan_mean": _mean(col["q_plan"]),
            "q_prior_mean": _mean(col["q_prior"]),
            "share_objective_plan_above_prior": _mean(
                np.greater(col["objective_plan"], col["objective_prior"])
            ),
            "share_q_plan_above_prior": _mean(np.greater(col["q_plan"], col["q_prior"])),
            "plan_prior_distance_mean": _mean(col["distance"]),
            "reward_abs_error": _mean(np.abs(np.array(col["reward_predicted"]) - np.array(col["reward"]))),
            "latent_error": latent_errors(ck, episodes),
        }
    return out


#: Bands of the discounted return that followed a step (a goal pays 10).
GOAL_BANDS = ((-np.inf, -3.0), (-3.0, -0.5), (-0.5, 0.5), (0.5, 3.0), (3.0, np.inf))
GOAL_SEED = 500  # ``--goals``: the games' first seed; game i plays GOAL_SEED + i


@torch.no_grad()
def goal_check(path: Path, games: int, opponent: str) -> dict[str, Any]:
    """Plays ``games`` games with the checkpoint's prior and reads its reward head and critics."""
    ckpt = load_checkpoint(str(path))
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    module = restore_module(ckpt, saved)
    model, gamma = module.model, float(module.discount)
    env = HockeyVsOpponentEnv(opponent=opponent)
    predicted, values, rewards, returns, winners = [], [], [], [], []
    for game in range(games):
        obs, _ = env.reset(seed=GOAL_SEED + game)
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
            "scored": {"steps": int(scored.sum()), "predicted_mean": _array_mean(predicted[scored])},
            "conceded": {"steps": int(conceded.sum()), "predicted_mean": _array_mean(predicted[conceded])},
            "other_steps_abs_error": _array_mean(np.abs(predicted - rewards)[~(scored | conceded)]),
        },
        "q_vs_return": {
            "correlation": round(float(np.corrcoef(values, returns)[0, 1]), 3),
            "bands": [
                {
                    "return_from": _bound(lo),
                    "return_to": _bound(hi),
                    "steps": int(s.sum()),
                    "q_mean": _array_mean(values[s]),
                }
                for lo, hi in GOAL_BANDS
                if (s := (returns >= lo) & (returns < hi)).any()
            ],
        },
    }


def _array_mean(x: np.ndarray) -> float | None:
    return round(float(x.mean()), 3) if x.size else None


def _bound(x: float) -> float | None:
    """A band's end for JSON: ``None`` where the band is open."""
    return None if np.isinf(x) else x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help="LABEL=PATH of TD-MPC2 checkpoints")
    parser.add_argument("--goals", action="store_true", help="read the reward head and critics at goals")
    parser.add_argument("--games", type=int, help="calibration's episodes per acting mode (20); --goals: 30")
    parser.add_argument("--sweep-games", type=int, default=20, help="episodes per planner setting")
    parser.add_argument("--sweep", nargs="*", default=list(SWEEP), help=f"settings of {list(SWEEP)}")
    parser.add_argument("--opponent", default="weak", choices=("weak", "strong"), help="--goals' opponent")
    parser.add_argument("--out", help="results file name (tdmpc2_planning; --goals: tdmpc2_goal_check)")
    args = parser.parse_args()
    pairs = [item.split("=", 1) for item in args.checkpoints]
    if any(len(p) != 2 for p in pairs) or set(args.sweep) - set(SWEEP):
        parser.exit(
            2, f"tdmpc2_planning: name checkpoints LABEL=PATH and sweep settings from {list(SWEEP)}.\n"
        )
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    if args.goals:
        for label, path in pairs:
            results[label] = goal_check(Path(path), args.games or 30, args.opponent)
            print(label, results[label]["reward_on_goal_steps"], results[label]["q_vs_return"]["correlation"])
        write(args.out or "tdmpc2_goal_check", {"checkpoints": results})
        return
    games = args.games or 20
    for label, path in pairs:
        ck = restore(Path(path))
        hp = ck.module.hparams
        entry: dict[str, Any] = {
            "checkpoint": str(path), "frames": ck.frames, "trained_acting_with": (
                "the planner" if hp.mpc and hp.plan_training else "the policy prior"),
            "planner": {k: hp[k] for k in ("horizon", "iterations", "num_samples", "num_pi_trajs",
                                           "num_elites", "temperature", "max_std", "eval_sample_elite")},
            "scenarios": {},
        }  # fmt: skip
        for name, make in ck.scenarios().items():
            start = time.perf_counter()
            scenario: dict[str, Any] = {"calibration": calibrate(ck, make, games)}
            print(label, name, {m: {k: v for k, v in c.items() if not isinstance(v, dict)}
                                for m, c in scenario["calibration"].items()}, flush=True)  # fmt: skip
            scenario["prior"] = play(ck, make, args.sweep_games, None)
            scenario["sweep"] = {}
            for setting in args.sweep:
                scenario["sweep"][setting] = play(ck, make, args.sweep_games, ck.planner(**SWEEP[setting]))
                print(label, name, setting, scenario["sweep"][setting], flush=True)
            scenario["wall_s"] = round(time.perf_counter() - start, 1)
            entry["scenarios"][name] = scenario
        results[label] = entry
    write(args.out or "tdmpc2_planning", {"checkpoints": results})


if __name__ == "__main__":
    main()
