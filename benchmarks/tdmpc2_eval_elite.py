"""TD-MPC2's evaluation action: the MPPI mean's first action against a Gumbel-sampled elite's (the
reference's ``eval_mode``), on the same trained checkpoint and the same evaluation games.

    python -m rl_lightning fit +experiment=tdmpc2_pendulum total_frames=3000 name=tdmpc2_elite logger=none
    python benchmarks/tdmpc2_eval_elite.py --ckpt runs/tdmpc2_elite/<time>/checkpoints/last.ckpt
        [--episodes 50] [--seeds 20000 30000]

The module is rebuilt from the checkpoint's config twice, with ``algo.eval_sample_elite`` false and true,
loaded with the same weights, and plays ``--episodes`` evaluation episodes per seed. Writes
``benchmarks/results/tdmpc2_eval_elite.json``.
"""

from __future__ import annotations

import argparse
import time

from _common import write
from omegaconf import OmegaConf

from rl_lightning.cli.run import build_module, container, env_config
from rl_lightning.training.evaluation import evaluate_variants
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--seeds", type=int, nargs="+", default=[20000, 30000])
    args = parser.parse_args()
    ckpt = load_checkpoint(args.ckpt)
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    env_cfg = env_config(saved)
    frames = next(v["frames"] for k, v in ckpt.items() if k.endswith("RLDataModule"))
    results = {}
    for sample_elite in (False, True):
        saved.algo.eval_sample_elite = sample_elite
        module = build_module(saved, env_cfg)
        module.on_load_checkpoint(ckpt)
        module.load_state_dict(ckpt["state_dict"])
        start = time.perf_counter()
        per_seed = {
            seed: evaluate_variants(module, env_cfg, args.episodes, seed, container(saved.eval.variants))
            for seed in args.seeds
        }
        results[f"eval_sample_elite={str(sample_elite).lower()}"] = {
            "return_mean": sum(s["return_mean"] for s in per_seed.values()) / len(per_seed),
            "per_seed": {str(seed): round(s["return_mean"], 2) for seed, s in per_seed.items()},
            "seconds": round(time.perf_counter() - start, 1),
        }
        print(sample_elite, results[f"eval_sample_elite={str(sample_elite).lower()}"])
    write(
        "tdmpc2_eval_elite",
        {
            "experiment": saved.name,
            "checkpoint_frames": frames,
            "episodes_per_seed": args.episodes,
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
