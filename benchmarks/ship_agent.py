"""Ships a hockey checkpoint as an agent: writes it without its optimizer states and records its evaluations.

    python benchmarks/ship_agent.py CKPT benchmarks/agents/NAME.ckpt --name hockey_agent_NAME
        [--games 200] [--goals weak_win=0.8 strong_win=0.5]
        [--recipe "python benchmarks/learning.py hockey --only EXPERIMENT"] [--plan true|false] [--both-modes]
        [--planner horizon=3 ...]

The shipped file keeps the weights, the run's config and the module's extra state (what ``evaluate``
needs) and drops ``optimizer_states`` and ``lr_schedulers`` (two thirds of an Adam run's checkpoint).
``evaluate`` then plays ``--games`` NORMAL games against each opponent on the held-out test episodes
(``split=test``, docs/evaluation.md: seeds that neither training nor the choice of the checkpoint saw; the
games ``tests/training/test_shipped_agent.py`` replays), and ``benchmarks/results/<name>.json`` gets the
rates with their 95% Wilson intervals beside the goals (``<opponent>_win``: a least win rate,
``<opponent>_loss_max``: a largest loss rate) under ``shipped``. ``--both-modes`` (TD-MPC2) also plays the
same games acting the other way (planning against the policy prior), under ``shipped["other_mode"]``, and
``--planner KEY=VALUE ...`` planning with other settings than the run's (``planner_variant``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch
from _common import RESULTS, ROOT, cli, write
from _learning_hooks import goals_met, outcomes

from rl_lightning.training.stats import wilson

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


def rates(stats: dict[str, float], games: int) -> dict[str, dict[str, Any]]:
    """``{opponent: {"win", "loss", "draw", "win_wilson", "loss_wilson"}}`` of an ``evaluate`` summary with
    per-opponent rates (the hooks' :func:`outcomes`, in the shipped records' short form): the rates over
    ``games`` games each, with 95% Wilson intervals of the win and loss rates."""
    out: dict[str, dict[str, Any]] = {}
    for opponent, x in outcomes(stats).items():
        out[opponent] = {r: x[f"{r}_rate"] for r in ("win", "loss", "draw")}
        for r in ("win", "loss"):
            out[opponent][f"{r}_wilson"] = wilson(round(x[f"{r}_rate"] * games), games)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("ckpt", type=Path, help="the run's checkpoint")
    parser.add_argument("out", type=Path, help="where the agent goes (benchmarks/agents/NAME.ckpt)")
    parser.add_argument("--name", required=True, help="the result's name: benchmarks/results/NAME.json")
    parser.add_argument("--games", type=int, default=200, help="test games against each opponent")
    parser.add_argument("--goals", nargs="*", default=[], help="goals as NAME=VALUE (weak_win=0.8)")
    parser.add_argument("--recipe", default="", help="the command that trained the run")
    parser.add_argument("--plan", choices=("true", "false"), help="evaluate's plan= (TD-MPC2)")
    parser.add_argument("--both-modes", action="store_true", help="TD-MPC2: also evaluate the other plan=")
    parser.add_argument("--planner", nargs="*", default=[], metavar="KEY=VALUE",
                        help="TD-MPC2: also plan with these settings (planner.KEY=VALUE)")  # fmt: skip
    args = parser.parse_args()
    if args.both_modes and not args.plan:
        parser.exit(2, "ship_agent: --both-modes needs --plan true|false (the mode the agent ships with).\n")
    goals = {k: float(v) for k, v in (g.split("=", 1) for g in args.goals)}
    frames = strip(args.ckpt, args.out)

    def evaluate(*extra: str) -> dict[str, float]:
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "evaluate.log"
            line = cli(ROOT, log, "evaluate", f"ckpt={args.out.resolve()}", f"episodes={args.games}",
                       "split=test", "logger=none", *extra)  # fmt: skip
        return json.loads(line)

    plan = [f"plan={args.plan}"] if args.plan else []
    own = evaluate(*plan)
    shipped: dict[str, Any] = {
        "checkpoint": str(args.out),
        "from": args.ckpt.name,
        "frames": frames,
        "split": "test",
        "games_per_opponent": args.games,
        "evaluation": rates(own, args.games),
        "reproduce": " ".join(
            ["python -m rl_lightning evaluate", f"ckpt={args.out}", f"episodes={args.games}", *plan]
        ),
    }
    if args.plan:
        shipped["plan"] = args.plan == "true"
    if goals:
        shipped["goals"] = goals
        shipped["goals_met"] = goals_met(outcomes(own), goals)
    if args.both_modes:
        other = "false" if args.plan == "true" else "true"
        stats = evaluate(f"plan={other}")
        shipped["other_mode"] = {
            "plan": other == "true",
            "evaluation": rates(stats, args.games),
            "reproduce": shipped["reproduce"].replace(f"plan={args.plan}", f"plan={other}"),
            **({"goals_met": goals_met(outcomes(stats), goals)} if goals else {}),
        }
    if args.planner:
        settings = [f"planner.{kv}" for kv in args.planner]
        stats = evaluate("plan=true", *settings)
        shipped["planner_variant"] = {
            "plan": True,
            "planner": dict(kv.split("=", 1) for kv in args.planner),
            "evaluation": rates(stats, args.games),
            "reproduce": " ".join(
                [
                    "python -m rl_lightning evaluate",
                    f"ckpt={args.out}",
                    f"episodes={args.games}",
                    "plan=true",
                    *settings,
                ]
            ),
            **({"goals_met": goals_met(outcomes(stats), goals)} if goals else {}),
        }
    # A record shipped before keeps what this script does not write (how the run was trained, its lineage),
    # and the same checkpoint's other way of acting where this call does not evaluate it again.
    previous = RESULTS / f"{args.name}.json"
    kept = json.loads(previous.read_text()) if previous.is_file() else {}
    before = kept.get("shipped", {})
    if not args.both_modes and "other_mode" in before and before.get("frames") == frames:
        shipped["other_mode"] = before["other_mode"]
    kept = {k: v for k, v in kept.items() if k not in ("benchmark", "when", "command", "machine", "shipped")}
    recipe = args.recipe or kept.pop("recipe", "")
    path = write(args.name, {**kept, "recipe": recipe, "shipped": shipped})
    print(json.dumps(shipped, indent=2))
    print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
