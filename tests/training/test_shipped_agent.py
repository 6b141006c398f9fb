"""The shipped hockey agents (``benchmarks/agents/``) reproduce their recorded evaluations through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
#: Each agent's record (``benchmarks/ship_agent.py`` writes them; SAC's came from its predecessor).
AGENTS = sorted(p.name for p in RESULTS.glob("hockey_agent*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("record", AGENTS)
def test_the_shipped_hockey_agent_wins_as_recorded(record: str, tmp_path: Path) -> None:
    shipped = json.loads((RESULTS / record).read_text())["shipped"]
    ckpt = ROOT / shipped["checkpoint"]
    games = shipped["games_per_opponent"]
    plan = [f"plan={str(shipped['plan']).lower()}"] if "plan" in shipped else []
    proc = run_main(tmp_path, "evaluate", f"ckpt={ckpt}", f"episodes={games}", "logger=none", *plan)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    for opponent, rates in shipped["evaluation"].items():
        for rate, recorded in ((r, rates[r]) for r in ("win", "loss", "draw")):
            # The same seeds replay the same games; a different CPU's float rounding may flip a few.
            assert stats[f"{opponent}/{rate}_rate"] == pytest.approx(recorded, abs=0.03), (opponent, rate)
    for goal, bound in shipped["goals"].items():
        opponent, kind = goal.split("_", 1)
        if kind == "win":
            assert stats[f"{opponent}/win_rate"] >= bound - 0.03, goal
        else:
            assert stats[f"{opponent}/loss_rate"] <= bound + 0.03, goal
