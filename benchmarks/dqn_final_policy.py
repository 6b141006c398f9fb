"""DQN's last policy on CartPole, over 5 seeds: is the policy a run ends with as good as its best?

For each configuration and seed: ``python -m rl_lightning fit +experiment=dqn_cartpole seed=S logger=none``
(50k frames, an evaluation of 10 episodes every 5k), then ``evaluate`` of its ``last.ckpt`` on 100
episodes. Per configuration: the 100-episode finals, how many reach 475, their interquartile mean with a
95% stratified-bootstrap interval, and how often the evaluations from 25k frames on reach 475 (the late
evaluations: a policy that flips between good and bad scores well only at some of them). Two
configurations by default: the recipe as it is (its deterministic policy a Polyak average of the online
network, ``algo.eval_polyak``) and the same without the average.

    python benchmarks/dqn_final_policy.py [--seeds 0 1 2 3 4] [--workdir DIR] [--parallel 2]

Writes ``benchmarks/results/dqn_final_policy.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from _common import cli, write

from rl_lightning.training.stats import interval_estimates

CONFIGS = {"recipe": [], "without_average": ["algo.eval_polyak=null"]}
THRESHOLD, LATE_FRAMES, EPISODES = 475.0, 25_000, 100
_EVAL = re.compile(r"eval @ (\d+) frames: return ([0-9.]+)")


def run_seed(workdir: Path, config: str, seed: int) -> dict[str, Any]:
    cwd = workdir / config / f"seed{seed}"
    cwd.mkdir(parents=True, exist_ok=True)
    log = cwd / "log.txt"
    args = ["+experiment=dqn_cartpole", f"seed={seed}", "logger=none", "progress_bar=false", "device=cpu"]
    summary = json.loads(cli(cwd, log, "fit", *args, *CONFIGS[config]))
    curve = [[int(f), float(v)] for f, v in _EVAL.findall(log.read_text())]
    final = json.loads(cli(cwd, log, "evaluate", f"ckpt={summary['last_ckpt']}", f"episodes={EPISODES}"))
    late = [v for f, v in curve if f >= LATE_FRAMES]
    return {
        "seed": seed,
        "final_100_episodes": final["return_mean"],
        "eval_curve": curve,
        "late_evals_reaching": [sum(v >= THRESHOLD for v in late), len(late)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_dqn_final"
    )
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one per core)")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for config in CONFIGS:
        with ThreadPoolExecutor(args.parallel) as pool:
            seeds = list(pool.map(lambda s, c=config: run_seed(args.workdir, c, s), args.seeds))
        finals = np.array([s["final_100_episodes"] for s in seeds])
        late = np.array([s["late_evals_reaching"] for s in seeds]).sum(0)
        results[config] = {
            "overrides": CONFIGS[config],
            "seeds": seeds,
            "final_reaching_475": int((finals >= THRESHOLD).sum()),
            "final_estimates": interval_estimates(finals[:, None]),
            "late_evals_reaching_475": f"{late[0]}/{late[1]}",
        }
        print(config, results[config]["final_reaching_475"], "of", len(seeds), "finals >= 475; late", late)
    write("dqn_final_policy", {
        "benchmark": "dqn_final_policy",
        "what": "the last checkpoint of dqn_cartpole (50k frames) evaluated on 100 episodes, per seed",
        "criterion": f"final >= {THRESHOLD} on at least 4 of 5 seeds",
        "reference": "Stable-Baselines3 with the zoo's recipe: 339 mean final on 3 seeds (sb3_compare.json)",
        "configurations": results,
    })  # fmt: skip


if __name__ == "__main__":
    main()
