"""``benchmarks/marinenav_parity.py``'s statistics, its resumable chunks and its tables (no public env)."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest


@pytest.fixture
def parity(load_benchmark):
    return load_benchmark("marinenav_parity")


def episodes(rng: np.random.Generator, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        kind = rng.integers(0, 3)  # success, collision, timeout
        out.append(
            {
                "success": kind == 0,
                "collision": kind == 1,
                "time": float(rng.normal(20, 3)),
                "energy": float(rng.normal(30000, 3000)),
                "path_length": float(rng.normal(50, 5)),
            }
        )
    return out


def test_two_proportion_and_chi_square_match_a_hand_computation(parity) -> None:
    # 30/50 against 20/50: pooled 0.5, standard error sqrt(0.25 * (1/50 + 1/50)) = 0.1, z = 0.2 / 0.1 = 2.
    test = parity.two_proportion(30, 50, 20, 50)
    assert test["z"] == pytest.approx(2.0)
    assert test["p_value"] == pytest.approx(0.0455003, abs=1e-6)
    # The same 2x2 table: every expected count 25, chi-square = 4 * 5^2 / 25 = 4 = z^2, same p-value.
    a = {"success": 30, "collision": 20, "timeout": 0}
    b = {"success": 20, "collision": 30, "timeout": 0}
    chi = parity.chi_square_outcomes(a, b)
    assert (chi["statistic"], chi["dof"]) == (pytest.approx(4.0), 1)
    assert chi["p_value"] == pytest.approx(test["p_value"])
    assert parity.two_proportion(0, 50, 0, 60)["p_value"] == 1.0


def test_chunk_stats_add_up_to_the_stats_of_all_episodes(parity) -> None:
    rng = np.random.default_rng(0)
    first, second = episodes(rng, 40), episodes(rng, 25)
    merged = parity.merge_stats(parity.chunk_stats(first), parity.chunk_stats(second))
    whole = first + second
    row = parity.summarize(merged)
    good = [e for e in whole if e["success"]]
    assert row["episodes"] == 65 and row["success"] == len(good)
    assert row["collision"] == sum(e["collision"] for e in whole)
    assert row["success"] + row["collision"] + row["timeout"] == 65
    energy = np.array([e["energy"] for e in good])
    assert row["energy_mean"] == pytest.approx(energy.mean())
    assert row["energy_std"] == pytest.approx(energy.std(ddof=1))
    # Welch's t from the sums is the t of the raw samples.
    other = episodes(rng, 70)
    times_b = np.array([e["time"] for e in other if e["success"]])
    times_a = np.array([e["time"] for e in good])
    se = math.sqrt(times_a.var(ddof=1) / len(times_a) + times_b.var(ddof=1) / len(times_b))
    t = parity.welch(merged["time"], parity.chunk_stats(other)["time"])["t"]
    assert t == pytest.approx((times_a.mean() - times_b.mean()) / se)


def fake_chunk(parity, calls: list, fail_after: int | None = None):
    """Stands in for a chunk played in both envs: records which chunk was asked for."""

    def chunk(args, agent, index, tmp):
        if fail_after is not None and len(calls) == fail_after:
            raise RuntimeError("interrupted")
        calls.append((agent, index))
        rng = np.random.default_rng(hash((agent, index)) % 2**32)
        stats = {side: parity.chunk_stats(episodes(rng, args.chunk)) for side in ("public", "ours")}
        return {**stats, "seconds": {"public": 1.0, "ours": 0.5}}

    return chunk


def test_an_interrupted_run_resumes_with_the_chunks_it_lacks(parity, tmp_path, monkeypatch) -> None:
    out = tmp_path / "parity.json"
    argv = ["marinenav_parity.py", "--public-python", "py", "--public-src", "src", "--policies", "m",
            "--agents", "IQN,DQN", "--episodes", "6", "--chunk", "2", "--skip-replay",
            "--out", str(out)]  # fmt: skip
    monkeypatch.setattr(sys, "argv", argv)
    calls: list = []
    # Round robin: one chunk per agent in turn, the JSON written after each.
    monkeypatch.setattr(parity, "policy_chunk", fake_chunk(parity, calls, fail_after=3))
    with pytest.raises(RuntimeError):
        parity.main()
    assert calls == [("IQN", 0), ("DQN", 0), ("IQN", 1)]
    saved = json.loads(out.read_text())
    assert saved["policies"]["IQN"]["episodes_per_agent"] == 4
    assert saved["policies"]["DQN"]["chunks_done"] == [0]
    assert any("6 episodes per agent" in n for n in saved["not_covered"])
    calls.clear()
    monkeypatch.setattr(parity, "policy_chunk", fake_chunk(parity, calls))
    parity.main()
    # The agent behind goes first.
    assert calls == [("DQN", 1), ("IQN", 2), ("DQN", 2)]
    saved = json.loads(out.read_text())
    for agent in ("IQN", "DQN"):
        row = saved["policies"][agent]
        assert row["chunks_done"] == [0, 1, 2]
        assert row["public"]["episodes"] == row["ours"]["episodes"] == 6
        assert row["seconds"] == {"public": 3.0, "ours": 1.5}
    assert not any("episodes per agent" in n for n in saved["not_covered"])
    # Another chunk size cannot be merged with these: the agents start afresh.
    monkeypatch.setattr(sys, "argv", [a if a != "2" else "3" for a in argv])
    calls.clear()
    parity.main()
    assert calls == [("IQN", 0), ("DQN", 0), ("IQN", 1), ("DQN", 1)]
    assert json.loads(out.read_text())["policies"]["IQN"]["chunks_done"] == [0, 1]


def test_tables_render_the_counts_and_ratios(parity) -> None:
    rng = np.random.default_rng(1)
    public, ours = parity.chunk_stats(episodes(rng, 30)), parity.chunk_stats(episodes(rng, 30))
    results = {"policies": {"AC_IQN": {"public": parity.summarize(public), "ours": parity.summarize(ours),
                                       "tests": parity.parity_tests(public, ours)}}}  # fmt: skip
    lines = parity.parity_table(results).splitlines()
    assert len(lines) == 3 and lines[2].startswith("| AC-IQN (30) | ")
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[1] == f"{public['success']} / {ours['success']}"
    assert len(cells) == lines[0].count("|") - 1

    def measured(steps: float) -> dict:
        return {"robot_steps_per_cpu_s": steps, "env_steps_per_cpu_s": steps / 2}

    rounds = [
        {"ours": {"env": measured(100.0), "batched_loop": measured(40.0), "per_robot_loop": measured(20.0)},
         "public": {"env": measured(5.0), "per_robot_loop": measured(4.0)}},
        {"ours": {"env": measured(120.0), "batched_loop": measured(30.0), "per_robot_loop": measured(25.0)},
         "public": {"env": measured(6.0), "per_robot_loop": measured(2.0)}},
    ]  # fmt: skip
    summary = parity.speed_summary(rounds)
    # The best round of each measurement: 120 / 6, 40 / 25, 40 / 4.
    assert summary["ratios"] == {
        "env_ours_over_public": pytest.approx(20.0),
        "env_steps_ours_over_public": pytest.approx(20.0),
        "batched_over_per_robot_loop_ours": pytest.approx(1.6),
        "batched_loop_ours_over_per_robot_loop_public": pytest.approx(10.0),
    }
    assert "| 20.0× |" in parity.speed_table(summary)
