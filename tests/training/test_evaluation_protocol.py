"""The evaluation protocol (docs/evaluation.md): the episodes that choose a checkpoint and the episodes a
figure is reported on never share a seed, in what a real fit and ``evaluate`` play."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.cli import SMOKE, run_main

import rl_lightning.data.collection as collection
import rl_lightning.training.evaluation as evaluation
from rl_lightning.training.protocol import SeedSets, check_disjoint, seed_range


def _sets(**changes) -> SeedSets:
    args = dict(seed=0, total_frames=50_000, train_envs=4, ranks=1, rank_stride=1_000_003,
                validation_seed=10_000, test_seed=1_000_000_000, eval_envs=10)  # fmt: skip
    return SeedSets.of_run(**{**args, **changes})


def test_the_default_sets_are_disjoint_and_a_clash_is_one_line() -> None:
    check_disjoint(_sets())
    with pytest.raises(ValueError, match=r"eval.test_seed=10005 meets the validation seeds 10000-10009"):
        check_disjoint(_sets(test_seed=10_005))
    with pytest.raises(ValueError, match=r"meets rank 1's training env seeds 1000003-1050006"):
        check_disjoint(_sets(ranks=2, test_seed=1_000_010))
    check_disjoint(_sets(total_frames=1000, test_seed=10_010))  # just above the validation seeds
    check_disjoint(_sets(seed=100, test_seed=0, validation_seed=50, eval_envs=2))  # below everything


@pytest.mark.slow
def test_a_fit_chooses_on_validation_seeds_and_evaluate_reports_on_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every env a fit and ``evaluate`` build is recorded with its seed and size; the eval envs of the fit
    (the validation episodes, which chose best.ckpt) and those of ``evaluate`` (the test episodes) share no
    seed, and neither do the training envs and the test episodes."""
    built: list[tuple[str, range]] = []
    phase = ["fit"]

    def recording(module, role):
        make_env = module.make_env

        def make(cfg, num_envs=None, seed=None, train=False, **kwargs):
            env = make_env(cfg, num_envs=num_envs, seed=seed, train=train, **kwargs)
            n = cfg.num_envs if num_envs is None else num_envs
            built.append((f"{phase[0]}/{role}", seed_range(seed, n)))
            return env

        monkeypatch.setattr(module, "make_env", make)

    recording(collection, "train")
    recording(evaluation, "eval")
    overrides = ("+experiment=dqn_cartpole", *SMOKE, "eval.every_frames=256", "eval.episodes=3",
                 "total_frames=768", "collect.warmup_frames=256", "logger=none")  # fmt: skip
    fit = run_main(tmp_path, "fit", *overrides)
    assert fit.returncode == 0, fit.stderr[-2000:]
    best = tmp_path / json.loads(fit.stdout.strip().splitlines()[-1])["best_ckpt"]
    phase[0] = "evaluate"
    proc = run_main(tmp_path, "evaluate", f"ckpt={best}", "episodes=5", "logger=none")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "test: 5 episodes (eval seed 1000000000)" in proc.stdout
    seeds = {role: set() for role in ("fit/train", "fit/eval", "evaluate/eval")}
    for role, seeds_of in built:
        seeds[role] |= set(seeds_of)
    assert len(seeds["fit/eval"]) == 3 and len(seeds["evaluate/eval"]) == 5  # evaluations were recorded
    assert not seeds["fit/eval"] & seeds["evaluate/eval"]
    assert not seeds["fit/train"] & seeds["evaluate/eval"]
    # split=validation replays the fit's own evaluations, seed for seed.
    phase[0] = "validation"
    proc = run_main(tmp_path, "evaluate", f"ckpt={best}", "split=validation", "logger=none")
    assert proc.returncode == 0 and "validation: 3 episodes (eval seed 10000)" in proc.stdout
    assert {s for role, r in built if role == "validation/eval" for s in r} == seeds["fit/eval"]
