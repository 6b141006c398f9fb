"""Throughput of our hockey env: environment steps per second on one CPU core.

Measures one two-player env with random actions and with zero actions, BasicOpponent against
BasicOpponent, the single-agent env against the weak opponent, and 16 single-agent envs in a gymnasium
``SyncVectorEnv``. Each figure is the best of ``--repeats`` timed runs (after a warm-up), so load from
other processes on a shared machine lowers it less; figures taken on a busy machine are lower bounds.

Usage: python benchmarks/hockey_speed.py [--steps 20000] [--repeats 3] [--seed 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
from _common import machine as machine_info
from _common import relative_paths

from rl_lightning.envs.hockey import BasicOpponent, HockeyEnv, HockeyVsOpponentEnv

# Measured with the course env (hockey 2.6, box2d 2.3.10) on one core of this kind of machine.
ORIGINAL_STEPS_PER_S = {"random_actions": 6900, "zero_actions": 5400}


def best_rate(run: Callable[[], int], repeats: int) -> dict[str, float]:
    """Best steps/s over ``repeats`` calls of ``run`` (which returns the number of steps it took)."""
    run()  # warm-up: imports, caches, first allocations
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        steps = run()
        rates.append(steps / (time.perf_counter() - start))
    return {"steps_per_s": max(rates), "median_steps_per_s": float(np.median(rates)), "steps": steps}


def two_player(actions: np.ndarray, seed: int) -> Callable[[], int]:
    env = HockeyEnv()

    def run() -> int:
        env.reset(seed=seed)
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        return len(actions)

    return run


def opponents(steps: int, seed: int) -> Callable[[], int]:
    env = HockeyEnv()
    one, two = BasicOpponent(weak=False, seed=seed), BasicOpponent(weak=True, seed=seed + 1)
    action = np.zeros(8, dtype=np.float32)

    def run() -> int:
        obs, _ = env.reset(seed=seed)
        for _ in range(steps):
            action[:4] = one.act(obs)
            action[4:] = two.act(env.obs_agent_two())
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs, _ = env.reset()
        return steps

    return run


def vs_weak(actions: np.ndarray, seed: int) -> Callable[[], int]:
    env = HockeyVsOpponentEnv(opponent="weak")

    def run() -> int:
        env.reset(seed=seed)
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        return len(actions)

    return run


def vector(num_envs: int, actions: np.ndarray, seed: int) -> Callable[[], int]:
    envs = gym.vector.SyncVectorEnv(
        [lambda: HockeyVsOpponentEnv(opponent="weak") for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )

    def run() -> int:
        envs.reset(seed=seed)
        for a in actions:
            envs.step(a)
        return len(actions) * num_envs

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20000, help="env steps per timed run (single env)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per figure; the best counts")
    parser.add_argument("--num-envs", type=int, default=16, help="envs in the SyncVectorEnv")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "hockey_speed.json")
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    random8 = rng.uniform(-1, 1, (args.steps, 8)).astype(np.float32)
    random4 = random8[:, :4].copy()
    zeros8 = np.zeros_like(random8)
    vec_steps = max(1, args.steps // args.num_envs)
    random_vec = rng.uniform(-1, 1, (vec_steps, args.num_envs, 4)).astype(np.float32)

    cases = {
        "two_player_random_actions": two_player(random8, args.seed),
        "two_player_zero_actions": two_player(zeros8, args.seed),
        "basic_opponent_vs_basic_opponent": opponents(args.steps, args.seed),
        "vs_weak_opponent_random_actions": vs_weak(random4, args.seed),
        f"sync_vector_{args.num_envs}_vs_weak_random_actions": vector(args.num_envs, random_vec, args.seed),
    }
    results = {}
    for name, run in cases.items():
        results[name] = best_rate(run, args.repeats)
        print(f"{name:45s} {results[name]['steps_per_s']:10.0f} steps/s")
    report = {
        "machine": machine_info(),
        "settings": vars(args) | {"out": str(args.out)},
        "results": results,
        "original_env_steps_per_s": ORIGINAL_STEPS_PER_S,
        "speedup_vs_original_random_actions": results["two_player_random_actions"]["steps_per_s"]
        / ORIGINAL_STEPS_PER_S["random_actions"],
        "note": "one process on a shared machine; vector figures count env steps (num_envs per call)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(relative_paths(report), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
