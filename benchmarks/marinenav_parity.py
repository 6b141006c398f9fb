"""Step-for-step parity of our marine-navigation env with the public one (Lin et al., RA-L 2025).

The public env (``train_RL_agents/`` of RobustFieldAutonomyLab/Distributional_RL_Decision_and_Control) runs
in its own interpreter, a benchmark-only virtual environment with numpy, scipy and gym 0.26 (never a
dependency of this project):

    python -m venv VENV && VENV/bin/pip install numpy scipy gym==0.26.2
    python benchmarks/marinenav_parity.py --public-python VENV/bin/python --public-src SRC/train_RL_agents

For each case the public env draws a scenario from its own generator (its ``reset`` with the case's level)
and plays it with perception noise off (position and velocity std 0, radius mean ratio 1), the robots
driven by a scripted goal-seeking controller (discrete) or a seeded random sequence (continuous), under the
public trainer's per-robot deactivation. Our ``MarineNavBatch`` then replays the same scenario (read from
the public episode record) and the same actions with ``perception_noise=False``. Compared at every step:
each robot's pose, water-relative and over-ground velocity and thrusts, its 37 observation values, its
reward, its done flag, and the episode length. Writes ``benchmarks/results/marinenav_parity.json``.

With ``--policies DIR`` (the public ``pretrained_models/`` folder) it also evaluates the pretrained
TorchScript policies in both envs on the same scenarios: the public env draws ``--episodes`` scenarios
cycling through the rows of the public evaluation schedule, each is played in the public env and in ours
with perception noise on and the public evaluation's rules (an episode ends at the first collision, when
every robot stopped or after 1001 steps; success means every robot reached its goal). The policies act as
the public deployment does: AC-IQN and DDPG take the actor's output, IQN the argmax of the mean of 32
quantiles at uniform random fractions, DQN the argmax, SAC a sample ``(2/π)·atan(μ + σ·ε)``. The public
interpreter borrows torch from this one's site-packages (appended after its own numpy, scipy and gym).
Each rate (success, collision, timeout) is compared with a two-proportion z-test, the 2x3 table of outcomes
with a chi-square test, travel time, energy and path length of successful episodes with Welch's t-test.
Episodes come in chunks of ``--chunk`` (chunk i: scenarios from the public generator seeded with
``--seed + i``), the agents in turn, one chunk each; the JSON is written after every chunk with each
agent's counts and sums, so an interrupted run (or one stopped by ``--max-seconds``) resumes where it
left off when run again with the same seed and chunk size.

Noisy perception's random streams differ between the envs (their distributions are the same by
construction), so the policy comparison is statistical, not step for step.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

# (name, level (robots, cores, obstacles, min start-goal distance), generator seed, action kind)
CASES = [
    ("defaults_cores_obstacles", (6, 8, 8, 30.0), 1, "steer"),
    ("paper_level_3_robots", (3, 0, 0, 30.0), 2, "steer"),
    ("paper_last_level", (5, 0, 4, 40.0), 3, "steer"),
    ("paper_last_level_b", (5, 0, 4, 40.0), 4, "steer"),
    ("crowded_center", (6, 0, 2, 20.0), 5, "steer"),
    ("continuous_random_cores", (5, 8, 4, 30.0), 6, "random_continuous"),
    ("discrete_random", (5, 4, 4, 35.0), 7, "random_discrete"),
]
THRUST_CHANGES = (0.0, -500.0, -1000.0, 500.0, 1000.0)


def steer(self_obs: list[float]) -> int:
    """A goal-seeking controller on the public observation: pick the discrete thrust changes that move
    the thrusts towards a forward thrust with a turn proportional to the goal's bearing."""
    gx, gy, _, _, _, left, right = self_obs
    bearing = math.atan2(gy, gx)
    forward = 600.0 if abs(bearing) < 1.0 else 100.0
    turn = 400.0 * max(-1.0, min(1.0, bearing))
    targets = (forward + turn, forward - turn)
    best = [
        min(range(5), key=lambda j, t=t, x=x: abs(x + THRUST_CHANGES[j] * 0.5 - t))
        for t, x in zip(targets, (left, right))
    ]
    return 5 * best[0] + best[1]


def pack(observation: tuple) -> list[float]:
    """The public ``(self, objects)`` observation as our 37-value row (zeros for a stopped robot)."""
    own, objects = observation
    if own is None:
        return [0.0] * 37
    rows = [list(o) for o in objects] + [[0.0] * 5] * (5 - len(objects))
    return list(own) + [v for row in rows for v in row] + [1.0] * len(objects) + [0.0] * (5 - len(objects))


def public_trace(src: str, case_file: str, out_file: str) -> None:
    """Runs one case in the public env (this interpreter is the public env's) and writes its trace."""
    sys.path.insert(0, src)
    from marinenav_env.envs.marinenav_env import MarineNavEnv3

    case = json.loads(Path(case_file).read_text())
    robots, cores, obstacles, min_dis = case["level"]
    env = MarineNavEnv3(seed=case["seed"])
    env.num_robots, env.num_cores, env.num_obs, env.min_start_goal_dis = robots, cores, obstacles, min_dis
    env.reset()
    record = env.episode_data()
    n = len(record["robots"]["start"])
    perception = record["robots"]["perception"]
    perception["pos_std"], perception["vel_std"], perception["r_mean_ratio"] = [0.0] * n, [0.0] * n, [1.0] * n
    record["env"]["is_eval_env"] = False
    observations, _, _ = env.reset_with_eval_config(record)
    rng = np.random.default_rng(case["seed"])
    continuous = case["actions"] == "random_continuous"
    trace = {
        "record": record,
        "actions": [],
        "states": [],
        "obs": [],
        "rewards": [],
        "dones": [],
        "colregs": 0,
    }

    def state() -> list[list[float]]:
        return [
            [r.x, r.y, r.theta, *r.velocity_r, *r.velocity, r.left_thrust, r.right_thrust] for r in env.robots
        ]

    trace["states"].append(state())
    trace["obs"].append([pack(o) for o in observations])
    length = 0
    while True:
        if case["actions"] == "steer":
            actions = [None if r.deactivated else steer(o[0]) for r, o in zip(env.robots, observations)]
        elif continuous:
            draws = rng.uniform(-1.0, 1.0, size=(n, 2))
            actions = [None if r.deactivated else list(draws[i]) for i, r in enumerate(env.robots)]
        else:
            draws = rng.integers(0, 25, size=n)
            actions = [None if r.deactivated else int(draws[i]) for i, r in enumerate(env.robots)]
        active = [not r.deactivated for r in env.robots]
        observations, rewards, dones, _ = env.step(actions, continuous)
        trace["colregs"] += sum(
            bool(a and getattr(r, "apply_COLREGs", False)) for a, r in zip(active, env.robots)
        )
        trace["actions"].append([a if a is not None else (0.0, 0.0) if continuous else 0 for a in actions])
        trace["states"].append(state())
        trace["obs"].append([pack(o) for o in observations])
        trace["rewards"].append([float(r) if a else 0.0 for r, a in zip(rewards, active)])
        trace["dones"].append([bool(d) and a for d, a in zip(dones, active)])
        for rob in env.robots:
            if rob.collision or rob.reach_goal:
                rob.deactivated = True
        if length >= 1000 or env.check_all_deactivated():
            break
        length += 1
    trace["outcomes"] = [[bool(r.reach_goal), bool(r.collision)] for r in env.robots]
    Path(out_file).write_text(json.dumps(trace, default=float))


def our_trace(trace: dict, continuous: bool) -> dict:
    """Replays the public trace's scenario and actions in our env; returns the same fields as arrays."""
    from rl_lightning.envs.marinenav import MarineNavBatch, Scenario

    scenario = Scenario.from_public(trace["record"])
    n = scenario.num_robots
    sim = MarineNavBatch(
        1, n, len(scenario.obstacles), len(scenario.cores), continuous=continuous, perception_noise=False
    )
    obs = [sim.reset([scenario])[0]]

    def state() -> np.ndarray:
        return np.concatenate(
            [sim.pos[0], sim.theta[0][:, None], sim.vel_r[0], sim.vel[0], sim.thrust[0]], axis=1
        )

    states, rewards, dones = [state()], [], []
    colregs = 0
    for actions in trace["actions"]:
        moving = sim.active[0].copy()
        result = sim.step(np.asarray(actions)[None])
        colregs += int((sim.colregs[0] & moving).sum())
        states.append(state())
        obs.append(result.obs[0])
        rewards.append(result.reward[0])
        dones.append(result.terminated[0] | result.truncated[0])
        if result.env_terminated[0] or result.env_truncated[0]:
            break
    return {
        "states": np.array(states),
        "obs": np.array(obs),
        "rewards": np.array(rewards),
        "dones": np.array(dones),
        "colregs": colregs,
        "outcomes": np.stack([sim.reached[0], sim.collided[0]], axis=1).tolist(),
    }


def compare(public: dict, ours: dict) -> dict:
    """Largest differences per field over the whole episode, and the agreement of the discrete events."""
    steps = min(len(public["rewards"]), len(ours["rewards"]))
    states = np.array(public["states"], dtype=np.float64)[: steps + 1]
    theta_diff = np.abs(wrap(states[..., 2] - ours["states"][: steps + 1, :, 2]))
    other = np.delete(np.abs(states - ours["states"][: steps + 1]), 2, axis=-1)
    obs = np.array(public["obs"], dtype=np.float64)[: steps + 1]
    obs_diff = np.abs(obs.astype(np.float32) - ours["obs"][: steps + 1])
    scale = np.maximum(1.0, np.abs(obs))
    return {
        "steps_public": len(public["rewards"]),
        "steps_ours": len(ours["rewards"]),
        "max_state_abs_diff": float(other.max()),
        "max_heading_abs_diff": float(theta_diff.max()),
        "max_obs_rel_diff": float((obs_diff / scale).max()),
        "max_reward_abs_diff": float(
            np.abs(np.array(public["rewards"])[:steps] - ours["rewards"][:steps]).max()
        ),
        "done_flags_equal": bool((np.array(public["dones"])[:steps] == ours["dones"][:steps]).all()),
        "outcomes_equal": public["outcomes"] == ours["outcomes"],
        "outcomes": {
            "goal": int(sum(g for g, _ in public["outcomes"])),
            "collision": int(sum(c for _, c in public["outcomes"])),
            "robots": len(public["outcomes"]),
        },
        "colregs_steps_public": int(public["colregs"]),
        "colregs_steps_ours": int(ours["colregs"]),
    }


EVAL_LEVELS = [
    (3, 0, 0, 30.0),
    (4, 0, 0, 35.0),
    (5, 0, 0, 40.0),
    (5, 0, 2, 40.0),
    (5, 0, 3, 40.0),
    (5, 0, 4, 40.0),
]
AGENTS = {
    "AC_IQN": "continuous",
    "DDPG": "continuous",
    "SAC": "continuous",
    "IQN": "discrete",
    "DQN": "discrete",
}


def policy_actions(model, agent: str, own, objects, mask):
    """Actions for a batch of robots from the public TorchScript ``model`` (float64 inputs)."""
    import torch

    # The traced models view the objects as (B * 5, 5): they need contiguous inputs.
    x = tuple(torch.as_tensor(np.ascontiguousarray(v, dtype=np.float64)) for v in (own, objects, mask))
    with torch.no_grad():
        if agent in ("AC_IQN", "DDPG"):
            return model(x).numpy()
        if agent == "SAC":
            mu, log_std = model(x)
            return ((2.0 / math.pi) * torch.atan(mu + log_std.exp() * torch.randn_like(mu))).numpy()
        if agent == "IQN":
            taus = torch.rand((len(own), 32), dtype=torch.float64)
            return model(x, taus).mean(1).argmax(1).numpy()
        return model(x).argmax(1).numpy()


def public_policy_eval(src: str, torch_site: str, spec_file: str, out_file: str) -> None:
    """Generates the scenarios and plays them with one pretrained policy in the public env."""
    sys.path.insert(0, src)
    sys.path.append(torch_site)
    import torch
    from marinenav_env.envs.marinenav_env import MarineNavEnv3

    spec = json.loads(Path(spec_file).read_text())
    torch.manual_seed(spec["seed"])
    model = torch.jit.load(spec["model"])
    agent, continuous = spec["agent"], AGENTS[spec["agent"]] == "continuous"
    maker, runner = MarineNavEnv3(seed=spec["seed"]), MarineNavEnv3(seed=spec["seed"])
    episodes = []
    for k in range(spec["first"], spec["first"] + spec["episodes"]):
        robots, cores, obstacles, min_dis = EVAL_LEVELS[k % len(EVAL_LEVELS)]
        maker.num_robots, maker.num_cores, maker.num_obs = robots, cores, obstacles
        maker.min_start_goal_dis = min_dis
        maker.reset()
        record = maker.episode_data()
        record["env"]["is_eval_env"] = False
        observations, _, _ = runner.reset_with_eval_config(record)
        n = len(runner.robots)
        times, energies, lengths = np.zeros(n), np.zeros(n), np.zeros(n)
        length = 0
        while True:
            active = [i for i, r in enumerate(runner.robots) if not r.deactivated]
            rows = [pack(observations[i]) for i in active]
            own = [r[:7] for r in rows]
            objects = [np.reshape(r[7:32], (5, 5)) for r in rows]
            mask = [r[32:] for r in rows]
            chosen = policy_actions(model, agent, own, np.array(objects), mask)
            actions = [None] * n
            for i, a in zip(active, chosen):
                actions[i] = list(map(float, a)) if continuous else int(a)
            before = [(r.x, r.y) for r in runner.robots]
            observations, _, _, _ = runner.step(actions, continuous)
            for i in active:
                rob = runner.robots[i]
                times[i] += rob.dt * rob.N
                energies[i] += rob.compute_step_energy_cost()
                lengths[i] += math.hypot(rob.x - before[i][0], rob.y - before[i][1])
                if rob.collision or rob.reach_goal:
                    rob.deactivated = True
            if length >= 1000 or runner.check_any_collision() or runner.check_all_deactivated():
                break
            length += 1
        episodes.append(
            {
                "record": record,
                "success": bool(runner.check_all_reach_goal()),
                "collision": bool(runner.check_any_collision()),
                "steps": length + 1,
                "time": float(times.mean()),
                "energy": float(energies.mean()),
                "path_length": float(lengths.mean()),
            }
        )
    Path(out_file).write_text(json.dumps(episodes, default=float))


def our_policy_eval(
    agent: str, model_path: str, records: list[dict], seed: int, batch: int = 50
) -> list[dict]:
    """Plays the public scenarios with one pretrained policy in our env, ``batch`` episodes side by side."""
    import torch

    from rl_lightning.envs.marinenav import MarineNavBatch, Scenario, split_observation

    torch.manual_seed(seed)
    model = torch.jit.load(model_path)
    continuous = AGENTS[agent] == "continuous"
    scenarios = [Scenario.from_public(r) for r in records]
    out = []
    for first in range(0, len(scenarios), batch):
        chunk = scenarios[first : first + batch]
        sim = MarineNavBatch(
            len(chunk), 5, 4, 1, continuous=continuous, perception_noise=True, end_on_collision=True
        )
        sim.seed(seed + first)
        obs = sim.reset(chunk)
        running = np.ones(len(chunk), dtype=bool)
        ended_at = np.zeros(len(chunk), dtype=np.int64)
        while running.any():
            rows = sim.active & running[:, None]
            own, objects, mask = split_observation(obs[rows].astype(np.float64))
            actions = np.zeros((len(chunk), 5, 2) if continuous else (len(chunk), 5))
            if rows.any():
                actions[rows] = policy_actions(model, agent, own, objects, mask)
            # Finished envs are frozen: their robots are inactive or stop with the episode.
            sim.active &= running[:, None]
            result = sim.step(actions if continuous else actions.astype(np.int64))
            obs = result.obs
            ended = running & (result.env_terminated | result.env_truncated)
            ended_at[ended] = sim.steps[ended]
            running &= ~ended
        info = sim.info()
        for i in range(len(chunk)):
            present = info["present"][i]
            out.append(
                {
                    "success": bool(info["reached"][i][present].all()),
                    "collision": bool(info["collided"][i][present].any()),
                    "steps": int(ended_at[i]),
                    "time": float(info["travel_time"][i][present].mean()),
                    "energy": float(info["energy"][i][present].mean()),
                    "path_length": float(info["path_length"][i][present].mean()),
                }
            )
    return out


RATES = ("success", "collision", "timeout")
MEANS = ("time", "energy", "path_length")


def chunk_stats(episodes: list[dict]) -> dict:
    """What a chunk of episodes contributes to an agent's figures, in a form that adds up across chunks:
    the outcome counts and, over the successful episodes, count, sum and sum of squares of each mean."""
    good = [e for e in episodes if e["success"]]
    stats = {
        "episodes": len(episodes),
        "success": len(good),
        "collision": int(sum(bool(e["collision"]) and not e["success"] for e in episodes)),
    }
    stats["timeout"] = stats["episodes"] - stats["success"] - stats["collision"]
    for key in MEANS:
        values = np.array([e[key] for e in good], dtype=np.float64)
        stats[key] = {"n": len(values), "sum": float(values.sum()), "sumsq": float((values**2).sum())}
    return stats


def merge_stats(a: dict | None, b: dict) -> dict:
    """The stats of two disjoint sets of episodes taken together."""
    if a is None:
        return b
    out = {k: a[k] + b[k] for k in ("episodes", *RATES)}
    for key in MEANS:
        out[key] = {f: a[key][f] + b[key][f] for f in ("n", "sum", "sumsq")}
    return out


def moments(sums: dict) -> tuple[int, float | None, float | None]:
    """Count, mean and sample standard deviation from a count, sum and sum of squares."""
    n = sums["n"]
    mean = sums["sum"] / n if n else None
    var = max(0.0, (sums["sumsq"] - n * mean * mean) / (n - 1)) if n > 1 else None
    return n, mean, (math.sqrt(var) if var is not None else None)


def summarize(stats: dict) -> dict:
    n = stats["episodes"]
    row = {"episodes": n, **{k: stats[k] for k in RATES}}
    for key in RATES:
        row[f"{key}_rate"] = stats[key] / n
    for key in MEANS:
        _, row[f"{key}_mean"], row[f"{key}_std"] = moments(stats[key])
    return row


def two_proportion(k1: int, n1: int, k2: int, n2: int) -> dict:
    """Two-sided two-proportion z-test (pooled variance) of k1/n1 against k2/n2."""
    pooled = (k1 + k2) / (n1 + n2)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    if se == 0:
        return {"difference": 0.0, "z": 0.0, "p_value": 1.0}
    z = (k1 / n1 - k2 / n2) / se
    return {"difference": k1 / n1 - k2 / n2, "z": z, "p_value": math.erfc(abs(z) / math.sqrt(2))}


def chi_square_outcomes(a: dict, b: dict) -> dict:
    """Chi-square test of equal outcome distributions (success, collision, timeout) in two samples."""
    table = np.array([[a[k] for k in RATES], [b[k] for k in RATES]])
    table = table[:, table.sum(0) > 0]
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    dof = table.shape[1] - 1
    # Survival function of chi-square for 1 or 2 degrees of freedom in closed form.
    p = 1.0 if dof == 0 else math.erfc(math.sqrt(stat / 2)) if dof == 1 else math.exp(-stat / 2)
    return {"statistic": stat, "dof": dof, "p_value": p}


def welch(a: dict, b: dict) -> dict:
    """Welch's t-test from two samples' count, sum and sum of squares, with a normal approximation of the
    p-value (samples of hundreds)."""
    (na, ma, sa), (nb, mb, sb) = moments(a), moments(b)
    if na < 2 or nb < 2:
        return {"t": None, "p_value": None}
    se = math.sqrt(sa * sa / na + sb * sb / nb)
    t = (ma - mb) / se if se > 0 else 0.0
    return {"t": t, "p_value": math.erfc(abs(t) / math.sqrt(2))}


def parity_tests(public: dict, ours: dict) -> dict:
    """Each rate by a two-proportion test, the outcome table by chi-square, each mean by Welch's t-test."""
    tests = {"outcomes_chi_square": chi_square_outcomes(public, ours)}
    for key in RATES:
        tests[f"{key}_rate_two_proportion"] = two_proportion(
            public[key], public["episodes"], ours[key], ours["episodes"]
        )
    for key in MEANS:
        tests[f"{key}_welch"] = welch(public[key], ours[key])
    return tests


def wrap(angle: np.ndarray) -> np.ndarray:
    return angle - 2 * math.pi * np.floor((angle + math.pi) / (2 * math.pi))


def replay_cases(args: argparse.Namespace, tmp: str) -> dict:
    results = {}
    for name, level, seed, kind in CASES:
        case_file, out_file = Path(tmp, f"{name}.json"), Path(tmp, f"{name}.trace.json")
        case_file.write_text(json.dumps({"level": level, "seed": seed, "actions": kind}))
        subprocess.run(
            [args.public_python, __file__, "--role-public", args.public_src, str(case_file), str(out_file)],
            check=True,
        )
        public = json.loads(out_file.read_text())
        ours = our_trace(public, continuous=kind == "random_continuous")
        results[name] = {"level": list(level), "seed": seed, "actions": kind, **compare(public, ours)}
        print(name, json.dumps(results[name]), flush=True)
    return results


def policy_chunk(args: argparse.Namespace, agent: str, index: int, tmp: str) -> dict:
    """Chunk ``index`` of an agent's episodes: ``--chunk`` scenarios drawn by the public env seeded with
    ``--seed + index``, continuing the evaluation schedule's cycle, played in both envs."""
    import time

    import torch

    model = str(Path(args.policies, f"traced_{agent}_model.pt"))
    spec_file, out_file = Path(tmp, f"{agent}.spec.json"), Path(tmp, f"{agent}.episodes.json")
    seed = args.seed + index
    spec = {"agent": agent, "model": model, "episodes": args.chunk, "first": index * args.chunk, "seed": seed}
    spec_file.write_text(json.dumps(spec))
    torch_site = str(Path(torch.__file__).resolve().parent.parent)
    started = time.perf_counter()
    subprocess.run(
        [
            args.public_python,
            __file__,
            "--role-policy",
            args.public_src,
            torch_site,
            str(spec_file),
            str(out_file),
        ],
        check=True,
    )
    public_seconds = time.perf_counter() - started
    public = json.loads(out_file.read_text())
    started = time.perf_counter()
    ours = our_policy_eval(agent, model, [e["record"] for e in public], seed)
    our_seconds = time.perf_counter() - started
    return {
        "public": chunk_stats(public),
        "ours": chunk_stats(ours),
        "seconds": {"public": public_seconds, "ours": our_seconds},
    }


def agent_row(row: dict | None, args: argparse.Namespace, index: int, chunk: dict) -> dict:
    """An agent's results with one more chunk merged in; a row made with another seed or chunk size (or
    before results came in chunks) is started afresh."""
    from _common import command_line

    if not chunks_done(row, args):
        row = {"seed": args.seed, "chunk": args.chunk, "chunks_done": [], "stats": {}, "seconds": {}}
    stats = {side: merge_stats(row["stats"].get(side), chunk[side]) for side in ("public", "ours")}
    seconds = {side: row["seconds"].get(side, 0.0) + chunk["seconds"][side] for side in ("public", "ours")}
    commands = list(row.get("commands", []))
    if command_line() not in commands:
        commands.append(command_line())
    return {
        # Chunks may come from several runs (an interrupted run resumes): each row says how it was made.
        "commands": commands,
        "seed": args.seed,
        "chunk": args.chunk,
        "chunks_done": sorted([*row["chunks_done"], index]),
        "episodes_per_agent": stats["public"]["episodes"],
        "public": summarize(stats["public"]),
        "ours": summarize(stats["ours"]),
        "tests": parity_tests(stats["public"], stats["ours"]),
        "stats": stats,
        "seconds": seconds,
    }


def chunks_done(row: dict | None, args: argparse.Namespace) -> set[int]:
    """The chunks of an agent's row that this run can build on (same seed and chunk size)."""
    if row and row.get("seed") == args.seed and row.get("chunk") == args.chunk:
        return set(row["chunks_done"])
    return set()


def next_chunk(row: dict | None, args: argparse.Namespace) -> int | None:
    """The first chunk an agent still lacks for ``--episodes`` episodes, or None when it has them."""
    done = chunks_done(row, args)
    wanted = range(math.ceil(args.episodes / args.chunk))
    return next((i for i in wanted if i not in done), None)


#: The speed benchmark's scenario level (robots, cores, obstacles, min start-goal distance) and layout.
SPEED_LEVEL = (5, 8, 4, 30.0)
SPEED_ENVS = 5 + 3


def per_robot_actions(model, agent: str, own, objects, mask):
    """Actions as the public code computes them: one policy call and one ``.cpu().numpy()`` per robot."""
    return np.array([policy_actions(model, agent, own[i : i + 1], objects[i : i + 1], mask[i : i + 1])[0]
                     for i in range(len(own))])  # fmt: skip


def timed(step, seconds: float, warmup: int) -> dict:
    """Calls ``step()`` (which returns the robot steps it took) ``warmup`` times untimed, then until
    ``seconds`` of this process's CPU time have passed; robot steps per CPU second and per wall second."""
    import time

    for _ in range(warmup):
        step()
    robot_steps, calls = 0, 0
    cpu, wall = time.process_time(), time.perf_counter()
    while time.process_time() - cpu < seconds:
        robot_steps += step()
        calls += 1
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "robot_steps": robot_steps,
        "env_steps": calls * SPEED_ENVS,
        "cpu_seconds": cpu,
        "wall_seconds": wall,
        "robot_steps_per_cpu_s": robot_steps / cpu,
        "robot_steps_per_wall_s": robot_steps / wall,
        "env_steps_per_cpu_s": calls * SPEED_ENVS / cpu,
    }


def one_core() -> None:
    """Pins this process to one core with one thread for torch and the BLAS libraries."""
    import os

    import torch

    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)


def public_speed(src: str, torch_site: str, spec_file: str, out_file: str) -> None:
    """Times the public env (this interpreter is the public env's): ``SPEED_ENVS`` of its envs stepped in a
    loop with random actions, and the same loop acting with the pretrained policy robot by robot."""
    sys.path.insert(0, src)
    sys.path.append(torch_site)
    import torch
    from marinenav_env.envs.marinenav_env import MarineNavEnv3

    one_core()
    spec = json.loads(Path(spec_file).read_text())
    torch.manual_seed(spec["seed"])
    model = torch.jit.load(spec["model"])
    rng = np.random.default_rng(spec["seed"])
    envs, observations, lengths = [], [], []
    for i in range(SPEED_ENVS):
        env = MarineNavEnv3(seed=spec["seed"] + i)
        env.num_robots, env.num_cores, env.num_obs, env.min_start_goal_dis = SPEED_LEVEL
        observations.append(env.reset()[0])
        envs.append(env)
        lengths.append(0)

    def step(policy: bool) -> int:
        robot_steps = 0
        for i, env in enumerate(envs):
            active = [j for j, r in enumerate(env.robots) if not r.deactivated]
            actions = [None] * len(env.robots)
            if policy:
                rows = [pack(observations[i][j]) for j in active]
                own = np.array([r[:7] for r in rows])
                objects = np.array([np.reshape(r[7:32], (5, 5)) for r in rows])
                mask = np.array([r[32:] for r in rows])
                chosen = per_robot_actions(model, spec["agent"], own, objects, mask)
            else:
                chosen = rng.integers(0, 25, size=len(active))
            for j, a in zip(active, chosen):
                actions[j] = int(a)
            observations[i], _, _, _ = env.step(actions, False)
            robot_steps += len(active)
            for rob in env.robots:
                if rob.collision or rob.reach_goal:
                    rob.deactivated = True
            lengths[i] += 1
            if lengths[i] > 1000 or env.check_all_deactivated():
                observations[i], lengths[i] = env.reset()[0], 0
        return robot_steps

    out = {
        "env": timed(lambda: step(False), spec["seconds"], spec["warmup"]),
        "per_robot_loop": timed(lambda: step(True), spec["seconds"], spec["warmup"]),
    }
    Path(out_file).write_text(json.dumps(out))


def our_speed(agent: str, model_path: str, seed: int, seconds: float, warmup: int) -> dict:
    """Times our env: ``SPEED_ENVS`` envs stepped as one batch with random actions, the batched acting
    loop (one policy call for every robot of every env) and the same env acting robot by robot."""
    import torch

    from rl_lightning.envs.marinenav import Level, MarineNavBatch, split_observation

    one_core()
    torch.manual_seed(seed)
    model = torch.jit.load(model_path)
    level = Level(*SPEED_LEVEL)
    rng = np.random.default_rng(seed)

    def loop(act) -> dict:
        robots, cores, obstacles, _ = SPEED_LEVEL
        sim = MarineNavBatch(SPEED_ENVS, robots, obstacles, cores)
        sim.seed(seed)
        state = {"obs": sim.reset(level=level)}

        def step() -> int:
            moving = sim.active
            actions = np.zeros(moving.shape, dtype=np.int64)
            if act is None:
                actions[:] = rng.integers(0, 25, size=moving.shape)
            elif moving.any():
                own, objects, mask = split_observation(state["obs"][moving].astype(np.float64))
                actions[moving] = act(model, agent, own, objects, mask)
            result = sim.step(actions)
            obs = result.obs
            for i in np.flatnonzero(result.env_terminated | result.env_truncated):
                obs[i] = sim.reset_env(int(i), level=level)
            state["obs"] = obs
            return int(moving.sum())

        return timed(step, seconds, warmup)

    return {
        "env": loop(None),
        "batched_loop": loop(policy_actions),
        "per_robot_loop": loop(per_robot_actions),
    }


def speed(args: argparse.Namespace, tmp: str) -> dict:
    """Both envs and both acting loops, ``--speed-rounds`` times in turn; the best round of each."""
    import torch

    agent = "IQN"
    model = str(Path(args.policies, f"traced_{agent}_model.pt"))
    spec = {"agent": agent, "model": model, "seed": args.seed, "seconds": args.speed_seconds, "warmup": 20}
    spec_file, out_file = Path(tmp, "speed.spec.json"), Path(tmp, "speed.json")
    spec_file.write_text(json.dumps(spec))
    torch_site = str(Path(torch.__file__).resolve().parent.parent)
    rounds = []
    for _ in range(args.speed_rounds):
        ours = our_speed(agent, model, args.seed, args.speed_seconds, 20)
        subprocess.run(
            [args.public_python, __file__, "--role-speed", args.public_src, torch_site, str(spec_file),
             str(out_file)],
            check=True,
        )  # fmt: skip
        rounds.append({"ours": ours, "public": json.loads(out_file.read_text())})
        print(json.dumps(rounds[-1]), flush=True)
    return speed_summary(rounds)


def speed_summary(rounds: list[dict]) -> dict:
    """Each measurement's best round (robot steps per CPU second) and the ratios the issue asks for."""

    def best(side: str, name: str, unit: str = "robot_steps_per_cpu_s") -> float:
        return max(r[side][name][unit] for r in rounds)

    env_ours, env_public = best("ours", "env"), best("public", "env")
    batched, per_robot = best("ours", "batched_loop"), best("ours", "per_robot_loop")
    public_loop = best("public", "per_robot_loop")
    return {
        "robot_steps_per_cpu_s": {
            "env_ours": env_ours,
            "env_public": env_public,
            "batched_loop_ours": batched,
            "per_robot_loop_ours": per_robot,
            "per_robot_loop_public": public_loop,
        },
        # Robots stop at different times in the two envs' timed windows: env steps too.
        "env_steps_per_cpu_s": {
            "env_ours": best("ours", "env", "env_steps_per_cpu_s"),
            "env_public": best("public", "env", "env_steps_per_cpu_s"),
        },
        "ratios": {
            "env_ours_over_public": env_ours / env_public,
            "env_steps_ours_over_public": best("ours", "env", "env_steps_per_cpu_s")
            / best("public", "env", "env_steps_per_cpu_s"),
            "batched_over_per_robot_loop_ours": batched / per_robot,
            "batched_loop_ours_over_per_robot_loop_public": batched / public_loop,
        },
        "rounds": rounds,
    }


def _p(test: dict) -> str:
    return "–" if test["p_value"] is None else f"{test['p_value']:.2f}"


def _pair(a: float | None, b: float | None, fmt: str) -> str:
    return " / ".join("–" if v is None else format(v, fmt) for v in (a, b))


def parity_table(results: dict) -> str:
    """The policy parity of ``marinenav_parity.json`` as a markdown table: per agent, the outcome counts in
    the public env and ours with each rate's two-proportion p-value, the chi-square p-value of the outcome
    table, and the means over successful episodes with Welch's p-values."""
    rows = [
        "| policy (episodes per env) | success public / ours | collision public / ours "
        "| timeout public / ours | two-proportion p (success, collision, timeout) "
        "| χ² p | time s | energy | path m "
        "| Welch p (time, energy, path) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for agent in AGENTS:
        if agent not in results["policies"]:
            continue
        r = results["policies"][agent]
        pub, ours, tests = r["public"], r["ours"], r["tests"]
        counts = [f"{pub[k]} / {ours[k]}" for k in RATES]
        rates = ", ".join(_p(tests[f"{k}_rate_two_proportion"]) for k in RATES)
        means = [_pair(pub[f"{k}_mean"], ours[f"{k}_mean"], f) for k, f in zip(MEANS, (".1f", ".0f", ".1f"))]
        welch_p = ", ".join(_p(tests[f"{k}_welch"]) for k in MEANS)
        name = agent.replace("_", "-")
        rows.append(
            f"| {name} ({pub['episodes']}) | {' | '.join(counts)} | {rates} "
            f"| {_p(tests['outcomes_chi_square'])} | {' | '.join(means)} | {welch_p} |"
        )
    return "\n".join(rows)


def speed_table(results: dict) -> str:
    """``marinenav_speed.json`` as a markdown table: robot steps per CPU second of each measurement and
    the ratios."""
    steps, envs, ratios = results["robot_steps_per_cpu_s"], results["env_steps_per_cpu_s"], results["ratios"]
    rows = [
        "| on one core, 8 envs of 5 robots | ours (robot steps / CPU s) "
        "| the public way (robot steps / CPU s) | ratio |",
        "| --- | --- | --- | --- |",
        f"| env only, random actions: ours batched, the public env's 8 envs in a loop "
        f"| {steps['env_ours']:,.0f} | {steps['env_public']:,.0f} | {ratios['env_ours_over_public']:.1f}× |",
        f"| the same, counted in env steps (env steps / CPU s) | {envs['env_ours']:,.0f} "
        f"| {envs['env_public']:,.0f} | {ratios['env_steps_ours_over_public']:.1f}× |",
        f"| acting with the IQN policy: ours batched, the public env with one call per robot "
        f"| {steps['batched_loop_ours']:,.0f} | {steps['per_robot_loop_public']:,.0f} "
        f"| {ratios['batched_loop_ours_over_per_robot_loop_public']:.1f}× |",
        f"| acting with the IQN policy in our env: one call for all robots, one call per robot "
        f"| {steps['batched_loop_ours']:,.0f} | {steps['per_robot_loop_ours']:,.0f} "
        f"| {ratios['batched_over_per_robot_loop_ours']:.2f}× |",
    ]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--public-python", required=True, help="interpreter of the public env's venv")
    parser.add_argument("--public-src", required=True, help="the public repository's train_RL_agents folder")
    parser.add_argument(
        "--policies", default=None, help="the public pretrained_models folder (policy parity)"
    )
    parser.add_argument("--agents", default=",".join(AGENTS), help="comma-separated agents for policy parity")
    parser.add_argument("--episodes", type=int, default=500, help="scenarios per agent for policy parity")
    parser.add_argument("--seed", type=int, default=253, help="scenario and policy seed for policy parity")
    parser.add_argument(
        "--chunk", type=int, default=50, help="episodes per chunk (results are saved and resumed per chunk)"
    )
    parser.add_argument(
        "--max-seconds", type=float, default=math.inf, help="start no new chunk after this many seconds"
    )
    parser.add_argument("--skip-replay", action="store_true", help="only the policy parity")
    parser.add_argument(
        "--out", default=None, help="result JSON (default benchmarks/results/marinenav_parity.json)"
    )
    parser.add_argument(
        "--speed", action="store_true", help="time the envs and acting loops instead (marinenav_speed.json)"
    )
    parser.add_argument("--speed-seconds", type=float, default=10.0, help="CPU seconds per speed measurement")
    parser.add_argument("--speed-rounds", type=int, default=2, help="speed measurements of each kind")
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _common import RESULTS, write

    if args.speed:
        if not args.policies:
            parser.error("--speed needs --policies (the acting loops use the pretrained IQN policy)")
        with tempfile.TemporaryDirectory() as tmp:
            result = speed(args, tmp)
        payload = {
            "what": f"robot steps per second on one core: {SPEED_ENVS} envs of {SPEED_LEVEL[0]} robots "
            f"(level {list(SPEED_LEVEL)}: robots, cores, obstacles, min start-goal distance); ours stepped "
            "as one batch, the public env's envs one after another with its per-robot action lists; random "
            "actions (env) or the pretrained IQN policy acting (loops: ours with one policy call for all "
            "robots, or robot by robot with one call and one .cpu().numpy() each as the public code does)",
            "protocol": "one thread, pinned to one core; 20 warm-up steps untimed; robot steps counted over "
            "the robots active at each step; per CPU second of the process (the machine is shared: wall "
            "seconds are in the rounds); each figure is the best of --speed-rounds rounds run in turn",
            "goal": "env throughput >= 10x the public env's",
            **result,
        }
        path = Path(args.out) if args.out else RESULTS / "marinenav_speed.json"
        print(json.dumps(result["ratios"]), "->", write("marinenav_speed", payload, path))
        return

    path = Path(args.out) if args.out else RESULTS / "marinenav_parity.json"
    previous = json.loads(path.read_text()) if path.is_file() else {}
    tolerances = {"state_abs": 1e-9, "heading_abs": 1e-9, "obs_rel": 1e-6, "reward_abs": 1e-9}
    with tempfile.TemporaryDirectory() as tmp:
        replay = previous.get("replay", {}) if args.skip_replay else replay_cases(args, tmp)
        policies = dict(previous.get("policies", {}))
        save(path, replay, policies, tolerances, args.episodes)
        if args.policies:
            import time

            started = time.monotonic()

            def chunks(agent: str) -> int:
                return len(chunks_done(policies.get(agent), args))

            # Round robin over the agents, one chunk at a time: a run cut short leaves every agent with
            # about as many episodes, and the next run with the same seed and chunk size completes them.
            while time.monotonic() - started < args.max_seconds:
                pending = [(a, next_chunk(policies.get(a), args)) for a in args.agents.split(",")]
                # The agents with the fewest chunks first: a resumed run evens them out.
                pending = sorted(((a, i) for a, i in pending if i is not None), key=lambda p: chunks(p[0]))
                if not pending:
                    break
                for agent, index in pending:
                    if time.monotonic() - started >= args.max_seconds:
                        break
                    chunk = policy_chunk(args, agent, index, tmp)
                    policies[agent] = agent_row(policies.get(agent), args, index, chunk)
                    print(agent, index, json.dumps(policies[agent]["public"]), flush=True)
                    save(path, replay, policies, tolerances, args.episodes)


def save(path: Path, replay: dict, policies: dict, tolerances: dict, goal: int = 500) -> None:
    """Writes the results so far (after the replays and after each agent: a long run keeps its parts)."""
    from _common import write

    agree = all(
        r["steps_public"] == r["steps_ours"]
        and r["max_state_abs_diff"] <= tolerances["state_abs"]
        and r["max_heading_abs_diff"] <= tolerances["heading_abs"]
        and r["max_obs_rel_diff"] <= tolerances["obs_rel"]
        and r["max_reward_abs_diff"] <= tolerances["reward_abs"]
        and r["done_flags_equal"]
        and r["outcomes_equal"]
        and r["colregs_steps_public"] == r["colregs_steps_ours"]
        for r in replay.values()
    )
    payload = {
        "what": "public-env episodes replayed step for step in our env (noise-free perception), and the "
        "public pretrained policies evaluated in both envs on the same scenarios",
        "public_env": "RobustFieldAutonomyLab/Distributional_RL_Decision_and_Control, train_RL_agents "
        "(gym 0.26.2)",
        "replay_tolerances": tolerances,
        "replay_all_agree": agree,
        "replay": replay,
        "policies": policies,
        "policy_protocol": {
            "scenarios": "in chunks of --chunk episodes, chunk i drawn by the public env seeded with "
            "--seed + i, cycling through the public evaluation schedule's six levels; the same scenarios in "
            "both envs",
            "rules": "public evaluation: ends at the first collision, when all robots stopped, or after 1001 "
            "steps; success = every robot reached its goal; perception noise on",
            "means": "time, energy, path length: per-episode means over robots, successful episodes only",
        },
        "not_covered": [
            "noisy perception streams step for step (different generators; same distributions)",
            "the Rainbow policy: the public tree lists pretrained_models/traced_Rainbow_model.pt, but its "
            "content is missing from the stored snapshot of the repository (its blob id is not the empty "
            "file's), so it could not be loaded",
        ],
    }
    short = {a: r["episodes_per_agent"] for a, r in policies.items() if r["episodes_per_agent"] < goal}
    if short:
        payload["not_covered"].append(
            f"the goal of {goal} episodes per agent: {short} so far (rerun the command: it resumes)"
        )
    missing = [a for a in AGENTS if a not in policies]
    if missing:
        payload["not_covered"].append(f"policies not evaluated in this run: {missing}")
    path = write("marinenav_parity", payload, path)
    print("replay agrees:", agree, "->", path)


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--role-public":
        public_trace(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "--role-policy":
        public_policy_eval(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "--role-speed":
        public_speed(*sys.argv[2:])
    else:
        main()
