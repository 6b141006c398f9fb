"""A hockey agent that wins: the curriculum recipe, what it cost, and the shipped agent's evaluation.

Two steps, so that the long training can run in the background and be resumed:

    # the recipe: SAC (or TD3) through the curriculum (shooting, defence, weak, weak+strong, self-play)
    python benchmarks/hockey_agent.py train --name hockey_sac --algo sac --frames 1500000 [--seed 0]
        [--workdir DIR]     # resume an interrupted run: the same command (fit ckpt_path=last)

    # curves and cost of the runs, 200 games against each opponent, the chosen checkpoint shipped
    python benchmarks/hockey_agent.py report --runs hockey_sac hockey_td3 --ship hockey_sac:best
        [--games 200] [--fresh-seeds 20000 30000] [--workdir DIR] [--out benchmarks/agents/NAME.ckpt]
        [--plot docs/images/hockey.png]     # a run in another work directory: DIR::NAME

    # the win and loss curves of the committed result, drawn again (docs/images/hockey_win_rates.png)
    python benchmarks/hockey_agent.py plot [--out PATH]

``train`` is ``python -m rl_lightning fit +experiment=sac_hockey_curriculum [algo=td3] total_frames=F
name=NAME seed=S`` in ``--workdir`` (its own MLflow store). ``report`` reads each run back from that store:
the evaluation curves against frames (20 games per opponent every 20k frames: ``eval/weak/*``,
``eval/strong/*``), the curriculum stage, the frames trained and the wall-clock hours (first to last
metric, resumes included); then evaluates the shipped checkpoint with the CLI,
``python -m rl_lightning evaluate ckpt=CKPT episodes=GAMES``, which plays ``GAMES`` new NORMAL games
against the weak and ``GAMES`` against the strong opponent (the run's ``eval.variants``, its evaluation
seed; the run's periodic evaluations chose the checkpoint on its first 20 of them) and again on
``--fresh-seeds`` (games no evaluation saw), and copies the checkpoint to ``benchmarks/agents/``.
Writes ``benchmarks/results/hockey_agent.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import mlflow
import torch
from _common import RESULTS, ROOT, write

EXPERIMENT = "sac_hockey_curriculum"
ALGOS = {"sac": [], "td3": ["algo=td3"]}
CURVES = (
    "eval/weak/win_rate", "eval/weak/loss_rate", "eval/weak/draw_rate",
    "eval/strong/win_rate", "eval/strong/loss_rate", "eval/strong/draw_rate",
    "eval/win_rate", "curriculum/stage",
)  # fmt: skip
RATES = ("win", "loss", "draw")
GOALS = {"weak_win": 0.90, "weak_loss_max": 0.05, "strong_win": 0.80}


def cli(cwd: Path, *args: str, log: Path | None = None) -> str:
    """``python -m rl_lightning ARGS`` in ``cwd``; returns the last line of its output."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-m", "rl_lightning", *args], cwd=cwd, capture_output=True, text=True, env=env
    )
    if log is not None:
        with log.open("a") as fh:
            fh.write(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def train(args: argparse.Namespace) -> None:
    args.workdir.mkdir(parents=True, exist_ok=True)
    overrides = [
        f"+experiment={EXPERIMENT}", *ALGOS[args.algo], f"total_frames={args.frames}", f"name={args.name}",
        f"seed={args.seed}", "progress_bar=false",
    ]  # fmt: skip
    if any(args.workdir.glob(f"runs/{args.name}/*/checkpoints/last.ckpt")):
        overrides.append("ckpt_path=last")  # an interrupted run resumes
    print(cli(args.workdir, "fit", *overrides, log=args.workdir / f"{args.name}.log"))


def read_run(client: mlflow.MlflowClient, name: str) -> dict:
    """Curves, frames and hours of the MLflow runs called ``name`` (a resume that started a new MLflow run
    continues the curves; where two runs logged the same frames, the newer one counts)."""
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"attributes.run_name = '{name}'",
        order_by=["attributes.start_time ASC"],
    )
    if not runs:
        raise SystemExit(f"no MLflow run named {name!r} in the work directory's store")
    curves: dict[str, dict[int, float]] = {key: {} for key in CURVES}
    frames, last_ms = 0, 0
    for run in runs:
        for key in CURVES:
            for m in client.get_metric_history(run.info.run_id, key):
                curves[key][int(m.step)] = round(m.value, 4)
        history = client.get_metric_history(run.info.run_id, "time/frames")
        if history:
            frames = max(frames, int(max(m.value for m in history)))
            last_ms = max(last_ms, max(m.timestamp for m in history))
    params = next((r.data.params for r in runs if r.data.params), {})
    return {
        "run": name,
        "algo": params.get("algo._target_", "").rsplit(".", 1)[-1],
        "seed": int(float(params.get("seed", 0))),
        "frames": frames,
        "hours": round((last_ms - runs[0].info.start_time) / 3.6e6, 2),
        "mlflow_runs": len(runs),
        "curves": {key: sorted([f, v] for f, v in points.items()) for key, points in curves.items()},
    }


def goals_met(rates: dict[str, dict[str, float]]) -> dict[str, bool]:
    return {
        "weak_win": rates["weak"]["win"] >= GOALS["weak_win"],
        "weak_loss_max": rates["weak"]["loss"] <= GOALS["weak_loss_max"],
        "strong_win": rates["strong"]["win"] >= GOALS["strong_win"],
    }


def pooled(evaluations: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The rates of several evaluations of equally many games, taken together."""
    return {
        opponent: {
            k: sum(e[opponent][k] for e in evaluations) / len(evaluations) for k in ("win", "loss", "draw")
        }
        for opponent in ("weak", "strong")
    }


def locate(spec: str, workdir: Path) -> tuple[Path, str]:
    """``[DIR::]NAME`` -> (the work directory, the name); without ``DIR::`` it is ``--workdir``."""
    where, _, name = spec.rpartition("::")
    return (Path(where).resolve() if where else workdir), name


def report(args: argparse.Namespace) -> None:
    runs = []
    for spec in args.runs:
        workdir, name = locate(spec, args.workdir)
        runs.append(read_run(mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}"), name))
    if args.ship.endswith(".ckpt"):  # a checkpoint file (a copy of one the run wrote)
        ckpt = Path(args.ship).resolve()
        ship_run, ship_which = args.runs[-1].rpartition("::")[2], ckpt.stem
    else:
        workdir, ship = locate(args.ship, args.workdir)
        ship_run, ship_which = ship.split(":")
        (ckpt,) = sorted(workdir.glob(f"runs/{ship_run}/*/checkpoints/{ship_which}.ckpt"))[-1:]
    saved = torch.load(ckpt, weights_only=True, map_location="cpu")
    frames = next(v["frames"] for k, v in saved.items() if k.endswith("RLDataModule"))

    def evaluate(*extra: str) -> dict[str, dict[str, float]]:
        with tempfile.TemporaryDirectory() as tmp:
            line = cli(Path(tmp), "evaluate", f"ckpt={ckpt}", f"episodes={args.games}", "logger=none", *extra)
        stats = json.loads(line)
        return {
            opponent: {k: stats[f"{opponent}/{k}_rate"] for k in ("win", "loss", "draw")}
            for opponent in ("weak", "strong")
        }

    shipped = evaluate()
    fresh = {seed: evaluate(f"eval_seed={seed}") for seed in args.fresh_seeds}
    out = (args.out or ROOT / "benchmarks" / "agents" / f"{ship_run}.ckpt").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    # The checkpoint without optimizer states: what evaluation needs, a third of the size.
    for key in ("optimizer_states", "lr_schedulers"):
        saved.pop(key, None)
    torch.save(saved, out)
    shown = str(out.relative_to(ROOT)) if out.is_relative_to(ROOT) else out.name
    agent = {
        "run": ship_run,
        "checkpoint": shown,
        "from": ckpt.name if args.ship.endswith(".ckpt") else f"{ship_which}.ckpt",
        "frames": frames,
        "games_per_opponent": args.games,
        "evaluation": shipped,
        "evaluation_on_fresh_seeds": fresh,
        "goals": GOALS,
        "goals_met": goals_met(shipped),
        "goals_met_on_fresh_seeds": goals_met(pooled(list(fresh.values()))) if fresh else None,
        "reproduce": f"python -m rl_lightning evaluate ckpt={shown} episodes={args.games}",
    }
    write(
        "hockey_agent",
        {
            "recipe": "python benchmarks/hockey_agent.py train --name NAME --algo sac|td3 --frames F "
            f"(python -m rl_lightning fit +experiment={EXPERIMENT} [algo=td3] total_frames=F)",
            "note": "curves: 20 games per opponent at each evaluation (every 20k frames); the shipped "
            "agent's figures: new games, the run's evaluation seed",
            "runs": runs,
            "lineage": args.lineage,
            "shipped": agent,
        },
    )
    if args.plot:
        plot_runs(runs, args.plot)
    print(json.dumps(agent, indent=2))


#: The legend of each run of the shipped agent's lineage (the runs' own names are internal).
LABELS = {
    "hk_sac_a": "SAC, curriculum from scratch",
    "hk_td3_a": "TD3, curriculum from scratch",
    "hk_sac_b": "SAC, resumed at 438k frames (shipped)",
}


def plot_runs(runs: list[dict], out: Path) -> None:
    """Win and loss rates against frames, one panel per rate and opponent, one line per run."""
    import numpy as np

    from rl_lightning.cli.plot import plot_curves

    groups = {}
    for run in runs:
        label = LABELS.get(run["run"]) or (f"{run['algo']} ({run['run']})" if run["algo"] else run["run"])
        groups[label] = {
            key: [(label, np.array([f for f, _ in pts]), np.array([v for _, v in pts]))]
            for key, pts in run["curves"].items()
            if key.startswith(("eval/weak/", "eval/strong/")) and not key.endswith("draw_rate") and pts
        }
    print(plot_curves(groups, out, "hockey: 20 evaluation games per opponent every 20k frames"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    default_workdir = Path(tempfile.gettempdir()) / "rl_lightning_hockey"
    t = sub.add_parser("train", help="run (or resume) the curriculum recipe")
    t.add_argument("--name", required=True)
    t.add_argument("--algo", choices=list(ALGOS), default="sac")
    t.add_argument("--frames", type=int, default=1_500_000)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--workdir", type=Path, default=default_workdir)
    r = sub.add_parser("report", help="curves and cost of runs; evaluate and ship a checkpoint")
    r.add_argument("--runs", nargs="+", required=True, help="[DIR::]RUN, DIR a work directory")
    r.add_argument(
        "--ship", required=True, help="[DIR::]RUN:best, [DIR::]RUN:last, or a checkpoint file of the last run"
    )
    r.add_argument(
        "--fresh-seeds",
        type=int,
        nargs="*",
        default=[20000, 30000],
        help="also evaluate the shipped agent on these eval seeds (games never seen in training)",
    )
    r.add_argument("--games", type=int, default=200)
    r.add_argument("--workdir", type=Path, default=default_workdir)
    r.add_argument("--out", type=Path, default=None)
    r.add_argument("--lineage", default="", help="how the runs relate (a resume of another's checkpoint)")
    r.add_argument("--plot", type=Path, default=None, help="also draw the runs' win/loss curves here")
    p = sub.add_parser("plot", help="draw the curves of benchmarks/results/hockey_agent.json again")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "hockey_win_rates.png")
    args = parser.parse_args()
    if args.command == "plot":
        plot_runs(json.loads((RESULTS / "hockey_agent.json").read_text())["runs"], args.out)
        return
    args.workdir = args.workdir.resolve()
    train(args) if args.command == "train" else report(args)


if __name__ == "__main__":
    main()
