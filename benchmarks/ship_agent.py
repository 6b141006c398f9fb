"""Ships a hockey checkpoint as an agent: writes it without its optimizer states and records its evaluations.

    python benchmarks/ship_agent.py CKPT benchmarks/agents/NAME.ckpt --name hockey_agent_NAME
        [--games 200] [--eval-seeds 20000 30000] [--goals weak_win=0.8 strong_win=0.5]
        [--recipe "python benchmarks/learning.py hockey --only EXPERIMENT"] [--plan true|false]

The shipped file keeps the weights, the run's config and the module's extra state (what ``evaluate``
needs) and drops ``optimizer_states`` and ``lr_schedulers`` (two thirds of an Adam run's checkpoint).
``evaluate`` then plays ``--games`` NORMAL games against each opponent with the run's own eval seed (the
games ``tests/training/test_shipped_agent.py`` replays) and with every ``--eval-seeds`` (games no run saw),
and ``benchmarks/results/<name>.json`` gets the rates beside the goals (``<opponent>_win``: a least win rate,
``<opponent>_loss_max``: a largest loss rate) under ``shipped``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from _common import ROOT, cli, write
from _learning_hooks import goals_met, outcomes

#: What ``evaluate`` does not need: the optimizers' moment estimates and the learning-rate schedules.
DROPPED = ("optimizer_states", "lr_schedulers")


def strip(source: Path, target: Path) -> int:
    """Writes ``source`` without :data:`DROPPED` to ``target``; returns the checkpoint's frames."""
    ckpt = torch.load(source, map_location="cpu", weights_only=True)
    for key in DROPPED:
        ckpt.pop(key, None)
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, target)
    return int(ckpt["RLDataModule"]["frames"])


def rates(stats: dict[str, float]) -> dict[str, dict[str, float]]:
    """``{opponent: {"win", "loss", "draw"}}`` of an ``evaluate`` summary with per-opponent rates (the
    hooks' :func:`outcomes`, in the shipped records' short form)."""
    return {o: {r: x[f"{r}_rate"] for r in ("win", "loss", "draw")} for o, x in outcomes(stats).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", type=Path, help="the run's checkpoint")
    parser.add_argument("out", type=Path, help="where the agent goes (benchmarks/agents/NAME.ckpt)")
    parser.add_argument("--name", required=True, help="the result's name: benchmarks/results/NAME.json")
    parser.add_argument("--games", type=int, default=200, help="games against each opponent")
    parser.add_argument("--eval-seeds", type=int, nargs="*", default=[20_000, 30_000])
    parser.add_argument("--goals", nargs="*", default=[], help="goals as NAME=VALUE (weak_win=0.8)")
    parser.add_argument("--recipe", default="", help="the command that trained the run")
    parser.add_argument("--plan", choices=("true", "false"), help="evaluate's plan= (TD-MPC2)")
    args = parser.parse_args()
    goals = {k: float(v) for k, v in (g.split("=", 1) for g in args.goals)}
    frames = strip(args.ckpt, args.out)
    plan = [f"plan={args.plan}"] if args.plan else []

    def evaluate(*extra: str) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "evaluate.log"
            line = cli(ROOT, log, "evaluate", f"ckpt={args.out.resolve()}", f"episodes={args.games}",
                       "logger=none", *plan, *extra)  # fmt: skip
        return json.loads(line)

    own = evaluate()
    fresh = {str(s): evaluate(f"eval_seed={s}") for s in args.eval_seeds}
    shipped: dict[str, Any] = {
        "checkpoint": str(args.out),
        "from": args.ckpt.name,
        "frames": frames,
        "games_per_opponent": args.games,
        "evaluation": rates(own),
        "evaluation_on_fresh_seeds": {s: rates(stats) for s, stats in fresh.items()},
        "reproduce": " ".join(
            ["python -m rl_lightning evaluate", f"ckpt={args.out}", f"episodes={args.games}", *plan]
        ),
    }
    if args.plan:
        shipped["plan"] = args.plan == "true"
    if goals:
        shipped["goals"] = goals
        shipped["goals_met"] = goals_met(outcomes(own), goals)
        shipped["goals_met_on_fresh_seeds"] = {
            s: goals_met(outcomes(stats), goals) for s, stats in fresh.items()
        }
    path = write(args.name, {"recipe": args.recipe, "shipped": shipped})
    print(json.dumps(shipped, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
