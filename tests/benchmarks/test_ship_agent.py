"""``benchmarks/ship_agent.py``: a shipped checkpoint drops the optimizer states and still evaluates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.cli import run_main

SAC_AGENT = Path(__file__).resolve().parents[2] / "benchmarks" / "agents" / "hockey_sac.ckpt"


@pytest.mark.slow
def test_a_shipped_checkpoint_keeps_what_evaluate_needs_and_records_rates(load_benchmark, tmp_path) -> None:
    ship = load_benchmark("ship_agent")
    # A checkpoint with optimizer states again, as fit writes them.
    full = torch.load(SAC_AGENT, map_location="cpu", weights_only=True)
    full["optimizer_states"] = [{"state": {0: {"exp_avg": torch.ones(1000)}}, "param_groups": []}]
    full["lr_schedulers"] = []
    torch.save(full, tmp_path / "full.ckpt")
    frames = ship.strip(tmp_path / "full.ckpt", tmp_path / "agent.ckpt")
    agent = torch.load(tmp_path / "agent.ckpt", map_location="cpu", weights_only=True)
    assert frames == full["RLDataModule"]["frames"] > 0
    assert set(full) - set(agent) == {"optimizer_states", "lr_schedulers"}
    proc = run_main(tmp_path, "evaluate", f"ckpt={tmp_path / 'agent.ckpt'}", "episodes=2", "logger=none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    by_opponent = ship.rates(stats, 2)
    assert set(by_opponent) == {"weak", "strong"}
    weak = by_opponent["weak"]
    assert {r: weak[r] for r in ("win", "loss", "draw")} == {
        r: stats[f"weak/{r}_rate"] for r in ("win", "loss", "draw")
    }
    # Each rate over the games with its 95% Wilson interval (2 games: wide).
    assert weak["win_wilson"]["low"] <= weak["win"] <= weak["win_wilson"]["high"]
    met = ship.goals_met(ship.outcomes(stats), {"weak_win": 0.0, "strong_loss_max": 1.0})
    assert met == {"weak_win": True, "strong_loss_max": True}
