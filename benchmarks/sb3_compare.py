"""Whole runs against Stable-Baselines3 on the same machine: wall time, frames/s, best and final evaluation.

For each task and seed, two processes are started at once (same process tree, same moment, so they share
whatever load the machine has): ``python -m rl_lightning fit +experiment=TASK seed=S`` and the same recipe
in Stable-Baselines3 (rl-baselines3-zoo's hyperparameters for the task), each with one torch thread (the
CLI's default ``torch_threads: 1``) and the same evaluation schedule (every ``eval.every_frames`` frames,
10 deterministic episodes). Each side runs as installed: the project's CLI flushes subnormal floats to zero
(its default ``flush_denormal: true``) and Stable-Baselines3 does not; ``--sb3-flush-denormal`` has
Stable-Baselines3 flush them too. With ``--back-to-back`` they run one after the other instead (the first
of the two alternates with the seed), each held to one core (CPU affinity), so each has the machine's caches
and memory bandwidth to itself but no more cores than at once; written to ``sb3_compare_back_to_back.json``.
The wall time of each is the whole process, imports and evaluations included.
It is split, from the moments each side finishes an evaluation, into a steady cost per frame (from the first
evaluation to the last, evaluations included) and a fixed cost (the rest: start-up, the time to the first
evaluation beyond its frames' steady cost, teardown), so the ratio of the training loops themselves shows
beside the whole-run ratio.

Recipes (both sides):

- ``dqn_cartpole``: 50k frames, lr 2.3e-3, batch 64, buffer 100k, 1000 random frames, gamma 0.99, 128 updates
  every 256 frames, epsilon 1 -> 0.04 over 8k frames (zoo: ``exploration_fraction`` 0.16 of 50k), [256, 256]
  ReLU nets, the Huber (smooth L1) TD loss, gradients clipped to norm 10, and one hard target copy per round
  of 128 updates. Stable-Baselines3's DQN always trains on the Huber loss, so the project's side runs with
  ``algo.loss=smooth_l1`` (the experiment's is the squared error). Its ``target_update_interval=10`` counts
  environment steps: it copies during collection, so its target stays fixed through each round of updates.
  The project's side therefore runs with ``algo.hard_update_every=128`` instead of the experiment's
  every-10-updates copy, which reaches higher final evaluations on its own (``dqn_cartpole.json``): the
  random frames fill whole collections (1024), so each round is 128 updates and the copy falls at the end of
  each round, where Stable-Baselines3's next collection makes its own.
- ``sac_pendulum``: 20k frames, lr 1e-3, batch 256, buffer 1M, 100 random frames, one update per frame,
  tau 0.005, gamma 0.99, automatic entropy, [256, 256] nets.

- ``ppo_cartpole``: PPO with the zoo's CartPole recipe (100k frames, 8 envs × 32 steps, 20 epochs of one
  minibatch of 256, γ 0.98, λ 0.8, lr 1e-3 annealed to 0, clipping 0.2, no entropy bonus, no value
  clipping, SB3's value loss weight 0.5 on a loss without ½, [64, 64] tanh nets), three processes started
  at once: this project, Stable-Baselines3 and CleanRL's ``ppo.py`` (the ``cleanrl`` package's, run as its
  own script with the same settings; it cannot anneal the clipping range, so it keeps 0.2). No side
  evaluates during training (CleanRL's script has no evaluation), so the wall times are the training runs
  alone; afterwards each side's final policy plays the same 100 held-out test episodes deterministically
  (seeds from ``eval.test_seed``). Written to ``sb3_compare_ppo.json``.

The peers live in an environment of their own, never the project's: ``--peers-python`` names its
interpreter, or the script makes one under ``--workdir`` (``peers/``: torch 2.13.0's CPU build,
stable-baselines3, and ``cleanrl`` 1.2.0 with the ``gym`` 0.23.1 its ``ppo.py`` is written for).

    python benchmarks/sb3_compare.py [--tasks dqn_cartpole sac_pendulum ppo_cartpole] [--seeds 0 1 2]
        [--workdir DIR] [--peers-python PY] [--back-to-back] [--sb3-flush-denormal] [--tag T]

Writes ``benchmarks/results/sb3_compare.json`` (``sb3_compare_T.json`` with ``--tag T``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import write

#: Task -> frames, evaluation period and threshold of the project's figures.
TASKS = {
    "dqn_cartpole": {
        "frames": 50_000,
        "eval_every": 5_000,
        "threshold": 475.0,
        # Stable-Baselines3's loss (Huber) and target copy (once per round of updates)
        "same_recipe": ["algo.loss=smooth_l1", "algo.hard_update_every=128"],
    },
    "sac_pendulum": {"frames": 20_000, "eval_every": 1_000, "threshold": -200.0},
}
#: The on-policy comparison: three sides, no evaluation during training, 100 test episodes afterwards.
PPO_TASK = "ppo_cartpole"
PPO_FRAMES = 100_000
#: The zoo's CartPole recipe in CleanRL's ppo.py flags (it has no clipping-range annealing).
CLEANRL_PPO = ["--env-id", "CartPole-v1", "--num-envs", "8", "--num-steps", "32", "--num-minibatches", "1",
               "--update-epochs", "20", "--gamma", "0.98", "--gae-lambda", "0.8", "--ent-coef", "0.0",
               "--learning-rate", "0.001", "--anneal-lr", "True", "--clip-coef", "0.2",
               "--clip-vloss", "False", "--vf-coef", "1.0", "--max-grad-norm", "0.5",
               "--cuda", "False"]  # fmt: skip
#: The first seed of the final evaluations (the project's ``eval.test_seed``).
TEST_SEED = 1_000_000_000
TEST_EPISODES = 100
#: What the peers' environment holds (``--peers-python`` or one made under ``--workdir``).
PEERS = (["torch==2.13.0"], ["stable-baselines3>=2.3", "gym==0.23.1", "pygame", "numpy<2", "tensorboard"],
         ["--no-deps", "--ignore-requires-python", "cleanrl==1.2.0"])  # fmt: skip
EVAL_EPISODES = 10
#: The per-run figures averaged over the seeds in the summary.
FIGURES = ("wall_s", "frames_per_s", "steady_ms_per_frame", "fixed_s", "best_eval", "final_eval")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def sb3_worker(task: str, seed: int, frames: int, flush_denormal: bool = False) -> dict:
    """The task's zoo recipe trained by Stable-Baselines3 in this process: its curve and wall time."""
    start = time.perf_counter()
    import gymnasium as gym
    import torch

    torch.set_flush_denormal(flush_denormal)
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    torch.set_num_threads(1)
    spec = TASKS[task]
    curve: list[tuple[int, float, float]] = []  # frames, mean return, time.time() when done
    eval_env = gym.make("CartPole-v1" if task == "dqn_cartpole" else "Pendulum-v1")

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % spec["eval_every"] == 0:
                mean, _ = evaluate_policy(
                    self.model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True
                )
                curve.append((self.num_timesteps, float(mean), time.time()))
            return True

    if task == "dqn_cartpole":
        model = DQN(
            "MlpPolicy", gym.make("CartPole-v1"), learning_rate=2.3e-3, batch_size=64, buffer_size=100_000,
            learning_starts=1000, gamma=0.99, target_update_interval=10, train_freq=256, gradient_steps=128,
            exploration_fraction=0.16, exploration_final_eps=0.04, policy_kwargs={"net_arch": [256, 256]},
            seed=seed, device="cpu",
        )  # fmt: skip
    else:
        model = SAC("MlpPolicy", gym.make("Pendulum-v1"), learning_rate=1e-3, seed=seed, device="cpu")
    eval_env.reset(seed=10_000 + seed)
    model.learn(total_timesteps=frames, callback=Evaluate())
    return {"curve": curve, "in_process_s": time.perf_counter() - start}


def greedy_returns(act, episodes: int = TEST_EPISODES) -> list[float]:
    """``act(obs [1, 4]) -> action`` on gymnasium's CartPole-v1, one episode per test seed."""
    import gymnasium as gym
    import torch

    env, returns = gym.make("CartPole-v1"), []
    for i in range(episodes):
        obs, _ = env.reset(seed=TEST_SEED + i)
        total, done = 0.0, False
        while not done:
            with torch.no_grad():
                action = act(torch.as_tensor(obs, dtype=torch.float32).unsqueeze(0))
            obs, reward, terminated, truncated, _ = env.step(int(action))
            total, done = total + float(reward), terminated or truncated
        returns.append(total)
    return returns


def sb3_ppo_worker(seed: int, frames: int) -> dict:
    """Stable-Baselines3's PPO with the zoo's CartPole recipe in this process: wall time of the training and
    the final policy's test returns."""
    import torch

    torch.set_num_threads(1)
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    start = time.perf_counter()
    model = PPO(
        "MlpPolicy", make_vec_env("CartPole-v1", n_envs=8, seed=seed), n_steps=32, batch_size=256,
        gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0, learning_rate=lambda left: 1e-3 * left,
        clip_range=lambda left: 0.2 * left, seed=seed, device="cpu",
    )  # fmt: skip
    model.learn(total_timesteps=frames)
    trained = time.perf_counter()
    returns = greedy_returns(lambda obs: model.predict(obs.numpy(), deterministic=True)[0][0])
    return {"train_s": trained - start, "eval_s": time.perf_counter() - trained, "test_returns": returns}


def cleanrl_ppo_worker(seed: int, frames: int) -> dict:
    """CleanRL's ``ppo.py`` (the ``cleanrl`` package's) run as its own script in this process, with the zoo's
    CartPole settings: wall time of the run and its final agent's test returns (the script's globals)."""
    import runpy

    import cleanrl.ppo

    sys.argv = ["ppo.py", *CLEANRL_PPO, "--seed", str(seed), "--total-timesteps", str(frames)]
    os.chdir(tempfile.mkdtemp(prefix="cleanrl_"))  # its TensorBoard logs
    start = time.perf_counter()
    script = runpy.run_path(cleanrl.ppo.__file__, run_name="__main__")
    trained = time.perf_counter()
    agent = script["agent"]
    returns = greedy_returns(lambda obs: agent.actor(obs).argmax(-1)[0])
    return {"train_s": trained - start, "eval_s": time.perf_counter() - trained, "test_returns": returns}


def peers_python(workdir: Path, given: str | None) -> str:
    """The interpreter of the peers' environment: ``given``, or one made (once) under ``workdir``."""
    if given:
        return given
    venv = workdir / "peers"
    python = venv / "bin" / "python"
    if not (venv / "ready").is_file():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        for packages in PEERS:
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
        (venv / "ready").write_text("")
    return str(python)


def peer_versions(peers: str, *packages: str) -> dict[str, str]:
    """The installed versions of ``packages`` in the peers' environment."""
    code = f"from importlib import metadata; print(*(metadata.version(p) for p in {list(packages)!r}))"
    out = subprocess.run([peers, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return dict(zip(packages, out))


def compare_ppo(seed: int, workdir: Path, frames: int, peers: str) -> dict:
    """The three PPO runs of one seed started at once; then each final policy's 100 test episodes. Each
    side's wall time is its whole process (imports included), less a peer's own test episodes at its end."""
    cwd = workdir / f"ours_{PPO_TASK}_s{seed}"
    cwd.mkdir(parents=True, exist_ok=True)
    ours = [sys.executable, "-m", "rl_lightning", "fit", f"+experiment={PPO_TASK}", f"seed={seed}",
            f"total_frames={frames}", "progress_bar=false", "device=cpu", "eval.every_frames=0",
            "eval.episodes=1", f"checkpoint.every_frames={frames}", "logger=none"]  # fmt: skip
    script = str(Path(__file__).resolve())
    theirs = [[peers, script, "--worker", side, "--seeds", str(seed), "--frames", str(frames)]
              for side in ("sb3_ppo", "cleanrl_ppo")]  # fmt: skip
    start = time.perf_counter()
    runs = finish([_start(ours, False, cwd), *(_start(cmd, False) for cmd in theirs)], start)
    (summary, our_wall), (sb3, sb3_wall), (cleanrl, cleanrl_wall) = runs
    sb3_wall, cleanrl_wall = sb3_wall - sb3["eval_s"], cleanrl_wall - cleanrl["eval_s"]
    evaluated = subprocess.run(
        [sys.executable, "-m", "rl_lightning", "evaluate", f"ckpt={summary['last_ckpt']}", "split=test",
         f"episodes={TEST_EPISODES}", "logger=none"],
        cwd=cwd, env=ENV, capture_output=True, text=True, check=True,
    )  # fmt: skip
    ours_eval = json.loads(evaluated.stdout.strip().splitlines()[-1])["return_mean"]
    sides = {
        "rl_lightning": (our_wall, ours_eval),
        "stable_baselines3": (sb3_wall, sb3["test_returns"]),
        "cleanrl": (cleanrl_wall, cleanrl["test_returns"]),
    }
    out = {
        side: {"wall_s": round(wall, 1), "frames_per_s": round(frames / wall, 1),
               "final_eval": round(ev if isinstance(ev, float) else statistics.mean(ev), 2)}
        for side, (wall, ev) in sides.items()
    }  # fmt: skip
    return {
        "task": PPO_TASK, "seed": seed, **out,
        "wall_ratio_sb3": round(our_wall / sb3_wall, 3),
        "wall_ratio_cleanrl": round(our_wall / cleanrl_wall, 3),
    }  # fmt: skip


def compile_project() -> None:
    """Writes the project's bytecode, as ``pip install`` does for every package it installs (Stable-Baselines3
    included): a checkout run where ``PYTHONDONTWRITEBYTECODE`` is set compiles its sources again in every
    process, about 0.6 s of start-up that an installed project does not have."""
    import compileall
    import importlib.util

    for package in ("rl_lightning", "callbacks"):
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.origin is not None, package
        compileall.compile_dir(Path(spec.origin).parent, quiet=1)


def _one_core() -> None:
    """Holds a back-to-back run's process (and every thread it starts) to the first allowed core."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _start(cmd: list[str], pin: bool, cwd: Path | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        cwd=cwd,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_one_core if pin else None,
    )


def start_ours(task: str, seed: int, workdir: Path, frames: int, pin: bool = False) -> subprocess.Popen:
    cwd = workdir / f"ours_{task}_s{seed}"
    cwd.mkdir(parents=True, exist_ok=True)
    args = ["fit", f"+experiment={task}", f"seed={seed}", f"total_frames={frames}", "progress_bar=false"]
    args += ["device=cpu", *TASKS[task].get("same_recipe", [])]
    args += [f"eval.every_frames={TASKS[task]['eval_every']}", f"eval.episodes={EVAL_EPISODES}"]
    return _start([sys.executable, "-m", "rl_lightning", *args], pin, cwd)


def start_sb3(
    task: str, seed: int, frames: int, peers: str, pin: bool = False, sb3_flush: bool = False
) -> subprocess.Popen:
    script = str(Path(__file__).resolve())
    cmd = [peers, script, "--worker", task, "--seeds", str(seed), "--frames", str(frames)]
    return _start(cmd + (["--sb3-flush-denormal"] if sb3_flush else []), pin)


def finish(procs: list[subprocess.Popen], start: float) -> list[tuple[dict, float]]:
    """Waits for the processes side by side; each one's last stdout line (JSON) and its own wall time."""
    results: list[tuple[dict, float] | BaseException] = [RuntimeError("not finished")] * len(procs)

    def wait(i: int) -> None:
        out, err = procs[i].communicate()
        wall = time.perf_counter() - start
        if procs[i].returncode != 0:
            results[i] = RuntimeError(err[-3000:])
        else:
            results[i] = (json.loads(out.strip().splitlines()[-1]), wall)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(len(procs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]


def our_curve(workdir: Path, task: str, seed: int, run_dir: str) -> list[tuple[int, float, float]]:
    import mlflow

    from rl_lightning.training.mlflow_logger import live_history

    cwd = workdir / f"ours_{task}_s{seed}"
    client = mlflow.MlflowClient(f"sqlite:///{cwd / 'mlflow.db'}")
    run_id = (cwd / run_dir / "mlflow_run_id").read_text().strip()
    history = live_history(client.get_metric_history(run_id, "eval/return_mean"))
    return [(int(m.step), m.value, m.timestamp / 1000) for m in history]


def figures(curve: list[tuple[int, float, float]], wall: float, frames: int, threshold: float) -> dict:
    """``curve``: (frames, mean return, epoch time when the evaluation ended) per evaluation."""
    first = next((f for f, v, _ in curve if v >= threshold), None)
    (f0, _, t0), (f1, _, t1) = curve[0], curve[-1]
    steady = (t1 - t0) / (f1 - f0)  # seconds per frame between the first and the last evaluation
    return {
        "wall_s": round(wall, 1),
        "frames_per_s": round(frames / wall, 1),
        "steady_ms_per_frame": round(steady * 1e3, 3),
        "fixed_s": round(wall - steady * frames, 1),
        "best_eval": round(max(v for _, v, _ in curve), 2),
        "final_eval": round(curve[-1][1], 2),
        "first_frames_at_threshold": first,
        "curve": [[f, round(v, 2)] for f, v, _ in curve],
    }


def compare(
    task: str,
    seed: int,
    workdir: Path,
    frames: int | None,
    peers: str,
    back_to_back: bool = False,
    sb3_flush: bool = False,
) -> dict:
    spec = TASKS[task]
    frames = frames or spec["frames"]
    if back_to_back:
        starters = {
            "ours": lambda: start_ours(task, seed, workdir, frames, pin=True),
            "sb3": lambda: start_sb3(task, seed, frames, peers, pin=True, sb3_flush=sb3_flush),
        }
        runs: dict[str, tuple[dict, float]] = {}
        for side in ("ours", "sb3") if seed % 2 == 0 else ("sb3", "ours"):
            start = time.perf_counter()
            runs[side] = finish([starters[side]()], start)[0]
        (summary, our_wall), (sb3, sb3_wall) = runs["ours"], runs["sb3"]
    else:
        start = time.perf_counter()
        ours, theirs = (
            start_ours(task, seed, workdir, frames),
            start_sb3(task, seed, frames, peers, sb3_flush=sb3_flush),
        )
        (summary, our_wall), (sb3, sb3_wall) = finish([ours, theirs], start)
    mine = figures(
        our_curve(workdir, task, seed, summary["run_dir"]), our_wall, summary["frames"], spec["threshold"]
    )
    base = figures(sb3["curve"], sb3_wall, frames, spec["threshold"])
    return {
        "task": task,
        "seed": seed,
        "rl_lightning": mine,
        "stable_baselines3": base,
        "wall_ratio": round(our_wall / sb3_wall, 3),
        "steady_ratio": round(mine["steady_ms_per_frame"] / base["steady_ms_per_frame"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=[*TASKS, PPO_TASK])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_sb3")
    parser.add_argument("--frames", type=int, help="frames per run instead of the task's (smoke runs)")
    parser.add_argument(
        "--back-to-back", action="store_true", help="one run after the other, each held to one core"
    )
    parser.add_argument(
        "--sb3-flush-denormal",
        action="store_true",
        help="Stable-Baselines3 flushes subnormal floats too (rl_lightning's flush_denormal, on by default)",
    )
    parser.add_argument("--tag", help="suffix of the result file name (e.g. more_seeds)")
    parser.add_argument("--peers-python", help="an environment's interpreter with the peers (default: made)")
    parser.add_argument("--worker", choices=[*TASKS, "sb3_ppo", "cleanrl_ppo"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker in ("sb3_ppo", "cleanrl_ppo"):
        worker = sb3_ppo_worker if args.worker == "sb3_ppo" else cleanrl_ppo_worker
        print(json.dumps(worker(args.seeds[0], args.frames or PPO_FRAMES)))
        return
    if PPO_TASK in args.tasks:
        if set(args.tasks) != {PPO_TASK} or args.back_to_back:
            parser.error(f"--tasks {PPO_TASK} runs alone (three sides at once, no --back-to-back).")
        peers = peers_python(args.workdir, args.peers_python)
        compile_project()
        rows = [compare_ppo(seed, args.workdir, args.frames or PPO_FRAMES, peers) for seed in args.seeds]
        for row in rows:
            print(json.dumps(row), flush=True)
        summary = {
            key: round(statistics.mean(r[key] for r in rows), 3)
            for key in ("wall_ratio_sb3", "wall_ratio_cleanrl")
        } | {
            f"{side}_{key}_mean": round(statistics.mean(r[side][key] for r in rows), 2)
            for side in ("rl_lightning", "stable_baselines3", "cleanrl") for key in ("wall_s", "final_eval")
        }  # fmt: skip
        name = "sb3_compare_ppo" + ("_smoke" if args.frames else "") + (f"_{args.tag}" if args.tag else "")
        print(write(name, {
            "how": "three processes started at once per seed (rl_lightning, Stable-Baselines3, CleanRL's "
                   "ppo.py), one torch thread each, no evaluation during training; wall time of each whole "
                   "process (imports included) less a peer's own test episodes; final_eval: the final "
                   f"policy's mean return over {TEST_EPISODES} held-out test episodes, deterministic",
            "goals": {"wall_ratio_sb3": 0.7, "wall_ratio_cleanrl": 0.9},
            "peers": peer_versions(peers, "stable-baselines3", "cleanrl", "torch"),
            "summary": summary, "runs": rows,
        }))  # fmt: skip
        return
    least = max(2 * TASKS[task]["eval_every"] for task in args.tasks)  # two evaluations of each task
    if args.frames and not args.worker and args.frames < least:
        parser.error(
            f"--frames {args.frames} is less than two evaluation periods of {' and '.join(args.tasks)}; use "
            f"--frames {least} or more (the steady cost per frame is measured between two evaluations)."
        )
    if args.worker:
        frames = args.frames or TASKS[args.worker]["frames"]
        print(json.dumps(sb3_worker(args.worker, args.seeds[0], frames, args.sb3_flush_denormal)))
        return
    peers = peers_python(args.workdir, args.peers_python)
    compile_project()
    rows = []
    for task in args.tasks:
        for seed in args.seeds:
            rows.append(
                compare(
                    task, seed, args.workdir, args.frames, peers, args.back_to_back, args.sb3_flush_denormal
                )
            )
            print(json.dumps(rows[-1])[:400], flush=True)
    summary = {}
    for task in args.tasks:
        mine = [r for r in rows if r["task"] == task]
        summary[task] = {
            "wall_ratio_mean": round(statistics.mean(r["wall_ratio"] for r in mine), 3),
            "steady_ratio_mean": round(statistics.mean(r["steady_ratio"] for r in mine), 3),
            "goal_wall_ratio": 0.8,
            **{
                f"{side}_{key}_mean": round(statistics.mean(r[side][key] for r in mine), 2)
                for side in ("rl_lightning", "stable_baselines3")
                for key in FIGURES
            },
        }
    name = "sb3_compare" + ("_back_to_back" if args.back_to_back else "") + ("_smoke" if args.frames else "")
    name += f"_{args.tag}" if args.tag else ""
    how = (
        "one process after the other per task and seed (the first alternating with the seed), each held to "
        "one core"
        if args.back_to_back
        else "both processes started at once per task and seed"
    )
    print(
        write(
            name,
            {
                "how": f"{how}, one torch thread each, both "
                "packages byte-compiled as pip installs them; wall time of the whole process (imports, "
                "evaluations and, for rl_lightning, checkpoints included); "
                "steady_ms_per_frame: wall time per frame from the first evaluation to the last (evaluations "
                "included), fixed_s: wall_s minus that rate times the frames (start-up, teardown)",
                "stable_baselines3": peer_versions(peers, "stable-baselines3")["stable-baselines3"],
                "subnormal_floats": (
                    "flushed to zero on both sides"
                    if args.sb3_flush_denormal
                    else "flushed by rl_lightning (flush_denormal, on by default), kept by Stable-Baselines3"
                ),
                "summary": summary,
                "runs": rows,
            },
        )
    )


if __name__ == "__main__":
    main()
