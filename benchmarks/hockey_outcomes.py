"""Outcomes of scripted hockey pairings: win / loss / draw rates and episode lengths.

Plays ``--games`` NORMAL-mode games per pairing in our two-player env (player 1 named first): strong vs
weak, weak vs strong, strong vs strong, and a do-nothing player 1 against each BasicOpponent. Who starts
alternates from game to game; every player is seeded from ``--seed``. Rates are from player 1's side,
with their standard errors.

Usage: python benchmarks/hockey_outcomes.py [--games 400] [--seed 0] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from _common import relative_paths

from rl_lightning.envs.hockey import BasicOpponent, HockeyEnv

PAIRINGS = (
    ("strong", "weak"),
    ("weak", "strong"),
    ("strong", "strong"),
    ("zero", "weak"),
    ("zero", "strong"),
)

Policy = Callable[[np.ndarray], np.ndarray]


def make_policy(name: str, seed: int) -> Policy:
    """``weak`` / ``strong`` BasicOpponent seeded with ``seed``, or ``zero`` (never acts)."""
    if name == "zero":
        zero = np.zeros(4, dtype=np.float32)
        return lambda obs: zero
    return BasicOpponent(weak=name == "weak", seed=seed).act


def play(one: str, two: str, games: int, seed: int) -> dict[str, float]:
    """Plays ``games`` games and returns player 1's outcome rates and the episode lengths."""
    env = HockeyEnv(mode="NORMAL")
    p1, p2 = make_policy(one, seed + 1), make_policy(two, seed + 2)
    winners, lengths = [], []
    action = np.zeros(8, dtype=np.float32)
    obs, _ = env.reset(seed=seed)
    for _ in range(games):
        steps, done = 0, False
        while not done:
            action[:4] = p1(obs)
            action[4:] = p2(env.obs_agent_two())
            obs, _, terminated, truncated, info = env.step(action)
            steps += 1
            done = terminated or truncated
        winners.append(info["winner"])
        lengths.append(steps)
        obs, _ = env.reset()
    w = np.asarray(winners)
    n = len(w)

    def rate(mask: np.ndarray) -> tuple[float, float]:
        p = float(mask.mean())
        return p, math.sqrt(p * (1 - p) / n)

    (win, win_se), (loss, loss_se), (draw, draw_se) = rate(w == 1), rate(w == -1), rate(w == 0)
    decided = [t for t, x in zip(lengths, w) if x != 0]
    return {
        "games": n,
        "win": win,
        "loss": loss,
        "draw": draw,
        "win_se": win_se,
        "loss_se": loss_se,
        "draw_se": draw_se,
        "mean_length": float(np.mean(lengths)),
        "mean_length_decided": float(np.mean(decided)) if decided else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=400, help="games per pairing")
    parser.add_argument("--seed", type=int, default=0)
    default_out = Path(__file__).parent / "results" / "hockey_outcomes.json"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()

    results = {}
    start = time.perf_counter()
    print(f"{'player 1 vs player 2':22s} {'win':>6s} {'loss':>6s} {'draw':>6s} {'length':>7s}")
    for one, two in PAIRINGS:
        r = play(one, two, args.games, args.seed)
        results[f"{one}_vs_{two}"] = r
        rates = f"{r['win']:6.3f} {r['loss']:6.3f} {r['draw']:6.3f}"
        print(f"{one + ' vs ' + two:22s} {rates} {r['mean_length']:7.1f}")
    report = {
        "settings": vars(args) | {"out": str(args.out), "mode": "NORMAL"},
        "machine": {"platform": platform.platform(), "python": sys.version.split()[0]},
        "seconds": time.perf_counter() - start,
        "results": results,
        "note": "rates from player 1's side; a timeout (251 steps) is a draw",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(relative_paths(report), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
