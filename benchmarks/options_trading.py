"""SAC with options trading GOOGL on the held-out period, against buy-and-hold, several seeds.

For each seed: ``python -m rl_lightning fit +experiment=sac_options_trading seed=S`` in its own work
directory; the validation and test curves (``eval/validation/return_mean``, ``eval/test/return_mean``:
100 × the log-return over the period) from the run's MLflow store; then the policies of the last
checkpoint and of ``best.ckpt`` (chosen on the validation year, never on the test period) are loaded with
the framework's safe loader and play the test period (2017-01-03 to 2018-08-29) day by day with their
deterministic ``act_eval``. Reported per policy: total return, annualised Sharpe ratio (daily simple
returns, mean / std × √252, no risk-free rate), maximum drawdown, average |position|, turnover, and the
options' shares of the days and number of switches. Buy-and-hold on the same period, with the same cost
model (it pays the cost of entering once), and flat (cash) are computed by the same env.

    python benchmarks/options_trading.py [--seeds 0 1 2] [--workdir DIR] [-- extra hydra overrides]

Writes ``benchmarks/results/sac_options_trading.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import mlflow
import numpy as np
import torch
from _common import cli, write
from omegaconf import OmegaConf
from tensordict import TensorDict

import rl_lightning.envs  # noqa: F401  (registers the trading ids)
from rl_lightning.cli.run import build_module, env_config
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

TRADING_DAYS = 252


def performance(wealth: np.ndarray, positions: np.ndarray) -> dict:
    """Total return, Sharpe, drawdown, exposure and turnover of a wealth path ``[T + 1]`` (starts at 1)."""
    daily = wealth[1:] / wealth[:-1] - 1.0
    std = daily.std()
    peak = np.maximum.accumulate(wealth)
    return {
        "total_return": float(wealth[-1] - 1.0),
        "sharpe": float(daily.mean() / std * math.sqrt(TRADING_DAYS)) if std > 0 else 0.0,
        "max_drawdown": float((1.0 - wealth / peak).max()),
        "mean_abs_position": float(np.abs(positions).mean()),
        "turnover_per_day": float(np.abs(np.diff(positions, prepend=0.0)).mean()),
        "days": len(daily),
    }


def play(env_kwargs: dict, policy) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """One deterministic episode: wealth path, positions and (for a module) the active options."""
    env = gym.make("TradingStocks-v0", **env_kwargs)
    obs, info = env.reset(seed=0)
    wealth, positions, options, t, done = [1.0], [], [], 0, False
    while not done:
        action, option = policy(obs, t)
        obs, _, terminated, truncated, info = env.step(action)
        wealth.append(info["wealth"])
        positions.append(info["position"])
        if option is not None:
            options.append(option)
        t, done = t + 1, terminated or truncated
    return np.array(wealth), np.array(positions), options


def module_policy(module):
    def act(obs: np.ndarray, t: int):
        td = TensorDict(
            {"observation": torch.as_tensor(obs).unsqueeze(0), "step_count": torch.tensor([[t]])}, [1]
        )
        out = module.act_eval(td)
        return out["action"][0].numpy(), int(out["option"][0])

    return act


def evaluate_checkpoint(path: Path, split: str) -> dict:
    ckpt = load_checkpoint(str(path))
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    module = build_module(saved, env_config(saved))
    module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"])
    module.eval()
    kwargs = {**OmegaConf.to_container(saved.env.kwargs), "split": split}
    wealth, positions, options = play(kwargs, module_policy(module))
    k = module.num_options
    counts = np.bincount(np.array(options), minlength=k) / len(options)
    return {
        **performance(wealth, positions),
        "option_share": [round(float(c), 4) for c in counts],
        "option_switches": int((np.diff(options) != 0).sum()),
    }


def baselines(kwargs: dict) -> dict:
    out = {}
    for name, position in (("buy_and_hold", 1.0), ("flat", 0.0)):
        wealth, positions, _ = play(kwargs, lambda obs, t, p=position: (np.array([p], np.float32), None))
        out[name] = performance(wealth, positions)
    return out


def run_seed(seed: int, args: argparse.Namespace) -> dict:
    workdir = args.workdir / f"sac_options_trading_s{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "log.txt"
    overrides = [f"seed={seed}", "progress_bar=false", *args.extra]
    start = time.perf_counter()
    summary = json.loads(cli(workdir, log, "fit", "+experiment=sac_options_trading", *overrides))
    wall = time.perf_counter() - start
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
    curves = {
        split: sorted([int(m.step), round(m.value, 3)] for m in client.get_metric_history(run_id, key))
        for split, key in (("validation", "eval/validation/return_mean"), ("test", "eval/test/return_mean"))
    }
    ckpts = workdir / summary["run_dir"] / "checkpoints"
    return {
        "seed": seed,
        "overrides": overrides,
        "wall_s": round(wall, 1),
        "frames": summary["frames"],
        "updates": summary["updates"],
        "best_ckpt_frames (chosen on validation)": summary.get("best_frames"),
        "test_last_ckpt": evaluate_checkpoint(ckpts / "last.ckpt", "test"),
        "test_best_ckpt": evaluate_checkpoint(ckpts / "best.ckpt", "test"),
        "validation_last_ckpt": evaluate_checkpoint(ckpts / "last.ckpt", "validation"),
        "curves_100x_log_return": curves,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_trading")
    parser.add_argument("extra", nargs="*", help="extra hydra overrides for every run (after --)")
    args = parser.parse_args()
    seeds = []
    for seed in args.seeds:
        seeds.append(run_seed(seed, args))
        brief = {k: seeds[-1][k] for k in ("seed", "wall_s", "test_last_ckpt", "test_best_ckpt")}
        print(json.dumps(brief), flush=True)
    kwargs = {"transaction_cost": 0.001}
    reference = {
        "test": baselines({**kwargs, "split": "test"}),
        "validation": baselines({**kwargs, "split": "validation"}),
    }
    mean = {
        f"{which}_{k}": float(np.mean([s[f"test_{which}_ckpt"][k] for s in seeds]))
        for which in ("last", "best")
        for k in ("total_return", "sharpe")
    }
    result = {
        "experiment": "sac_options_trading",
        "data": "GOOGL daily closes bundled with gym-anytrading; train 2009-07..2015-12, validation 2016, "
        "test 2017-01-03..2018-08-29 (held out); 10 bp cost per unit of position changed",
        "buy_and_hold_and_flat": reference,
        "seed_means_on_test": mean,
        "beats_buy_and_hold_on_test": {
            which: [
                s["seed"]
                for s in seeds
                if s[f"test_{which}_ckpt"]["total_return"] > reference["test"]["buy_and_hold"]["total_return"]
            ]
            for which in ("last", "best")
        },
        "note": "CPU run, seeds one after another on a 2-core machine shared with other jobs.",
        "seeds": seeds,
    }
    print(write("sac_options_trading", result))


if __name__ == "__main__":
    main()
