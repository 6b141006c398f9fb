"""``benchmarks/tdmpc2_planning.py`` scores the plan's and the prior's actions as the planner does and sets
them beside the returns that followed."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
AGENT = BENCHMARKS / "agents" / "hockey_tdmpc2.ckpt"


@pytest.mark.slow
def test_calibration_scores_both_actions_with_the_planners_own_objective(monkeypatch) -> None:
    # Imported under its own name: its dataclass reads annotations through sys.modules.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = importlib.import_module("tdmpc2_planning")
    assert bench.__name__ in sys.modules
    ck = bench.restore(AGENT)
    torch.manual_seed(0)
    z = ck.model.encode(torch.randn(1, ck.module.obs_shape[0]))
    planner = ck.planner()
    # The prior's sequence is its mean action along the model's rollout; at horizon 1 its score is the
    # planner's estimate_value of that action: r̂ + γ · alive · Q_avg(next(z, a), π).
    seq = bench.prior_sequence(ck, z, planner.horizon)
    torch.testing.assert_close(seq[0], ck.model.pi(z).mean)
    # (The planner's estimate draws: two of the Q heads and the prior's action at the horizon.)
    torch.manual_seed(1)
    scored = bench.objective(ck, planner, z, seq)
    torch.manual_seed(1)
    assert scored == pytest.approx(float(planner.estimate_value(ck.model, z, seq)))
    weak = ck.scenarios()["weak"]
    out = bench.calibrate(ck, weak, games=1)
    assert set(out) == {"prior", "plan"} and out["prior"]["games"] == out["plan"]["games"] == 1
    for mode in out.values():
        assert (
            0.0 <= mode["share_objective_plan_above_prior"] <= 1.0 and mode["plan_prior_distance_mean"] >= 0
        )
        assert set(mode["latent_error"]) == {"after_1", "after_2", "after_3"}
    changed = ck.planner(**bench.SWEEP["half prior trajectories"])
    assert changed.num_pi_trajs == changed.num_samples // 2 and changed.horizon == planner.horizon
