"""Risk-sensitive IQN on discrete laser hockey: CVaR(0.25) against risk-neutral acting, vs the weak opponent.

For each risk setting and seed: ``python -m rl_lightning fit +experiment=iqn_hockey_discrete seed=S
total_frames=F [algo.risk=cvar algo.risk_param=0.25]`` in a work directory with its own MLflow store, the
evaluation curves (win / loss / draw rates and return against frames) read back from it, then
``evaluate`` of the final checkpoint (``last.ckpt``) over ``--games`` new games. Both settings get the same
frame budget, seeds and evaluation games.

    python benchmarks/iqn_hockey_risk.py [--seeds 0 1] [--frames 150000] [--games 100]
        [--risks neutral cvar] [--workdir DIR] [--append]

Writes ``benchmarks/results/iqn_hockey_risk.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import mlflow
from _common import RESULTS, cli, write

RISKS = {"neutral": [], "cvar": ["algo.risk=cvar", "algo.risk_param=0.25"]}
CURVES = ("eval/win_rate", "eval/loss_rate", "eval/draw_rate", "eval/return_mean")


def run(risk: str, seed: int, args: argparse.Namespace) -> dict:
    workdir = args.workdir / f"{risk}_s{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "log.txt"
    overrides = [f"seed={seed}", f"total_frames={args.frames}", "progress_bar=false", *RISKS[risk]]
    start = time.perf_counter()
    summary = json.loads(cli(workdir, log, "fit", "+experiment=iqn_hockey_discrete", *overrides))
    wall = time.perf_counter() - start
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
    curves = {
        key: sorted([int(m.step), round(m.value, 4)] for m in client.get_metric_history(run_id, key))
        for key in CURVES
    }
    last = workdir / summary["run_dir"] / "checkpoints" / "last.ckpt"
    final = json.loads(cli(workdir, log, "evaluate", f"ckpt={last}", f"episodes={args.games}", "logger=none"))
    return {
        "risk": risk,
        "seed": seed,
        "overrides": overrides,
        "wall_s": round(wall, 1),
        "frames": summary["frames"],
        "updates": summary["updates"],
        f"final_{args.games}_games": final,
        "eval_curves": curves,
    }


def summarize(runs: list[dict], games: int) -> dict:
    out = {}
    for risk in RISKS:
        mine = [r[f"final_{games}_games"] for r in runs if r["risk"] == risk]
        if mine:
            out[risk] = {
                k: round(sum(m[k] for m in mine) / len(mine), 4)
                for k in ("win_rate", "loss_rate", "draw_rate", "return_mean")
            }
            out[risk]["seeds"] = len(mine)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--frames", type=int, default=150_000)
    parser.add_argument("--games", type=int, default=100)
    parser.add_argument("--risks", nargs="+", default=list(RISKS), choices=list(RISKS))
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_hockey_risk"
    )
    parser.add_argument("--append", action="store_true", help="keep the runs of an existing result")
    args = parser.parse_args()
    runs = []
    for seed in args.seeds:
        for risk in args.risks:
            runs.append(run(risk, seed, args))
            print(json.dumps({k: v for k, v in runs[-1].items() if k != "eval_curves"}), flush=True)
    path = RESULTS / "iqn_hockey_risk.json"
    if args.append and path.is_file():
        kept = [r for r in json.loads(path.read_text())["runs"] if (r["risk"], r["seed"]) not in
                {(r["risk"], r["seed"]) for r in runs}]  # fmt: skip
        runs = kept + runs
    runs.sort(key=lambda r: (r["risk"], r["seed"]))
    result = {
        "question": "IQN acting on CVaR(0.25) against risk-neutral IQN, discrete hockey vs the weak opponent "
        "after the same frame budget: win / loss / draw of the final checkpoints",
        "run_command": "python -m rl_lightning fit +experiment=iqn_hockey_discrete seed=S total_frames=F "
        "[algo.risk=cvar algo.risk_param=0.25]; then python -m rl_lightning evaluate "
        f"ckpt=<run>/checkpoints/last.ckpt episodes={args.games}",
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "summary": summarize(runs, args.games),
        "runs": runs,
    }
    print(write("iqn_hockey_risk", result))


if __name__ == "__main__":
    main()
