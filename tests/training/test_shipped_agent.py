"""The shipped hockey agent (``benchmarks/agents/``) reproduces its recorded evaluation through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import run_main

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "benchmarks" / "results" / "hockey_agent.json"


@pytest.mark.slow
def test_the_shipped_hockey_agent_wins_as_recorded(tmp_path: Path) -> None:
    shipped = json.loads(RESULT.read_text())["shipped"]
    ckpt = ROOT / shipped["checkpoint"]
    games = shipped["games_per_opponent"]
    proc = run_main(tmp_path, "evaluate", f"ckpt={ckpt}", f"episodes={games}", "logger=none")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    for opponent, rates in shipped["evaluation"].items():
        for rate, recorded in rates.items():
            # The same seeds replay the same games; a different CPU's float rounding may flip a few.
            assert stats[f"{opponent}/{rate}_rate"] == pytest.approx(recorded, abs=0.03), (opponent, rate)
    assert stats["weak/win_rate"] >= 0.9 - 0.03 and stats["strong/win_rate"] >= 0.8 - 0.03
