"""DQN frames/s from pixels on a CPU: rl_lightning's run against a hand-written loop and Stable-Baselines3.

Two recipes, the same on every side: ``dqn_minatar`` on MinAtar Breakout (one update of 32 per frame) and
``dqn_atari_cpu`` on Atari Breakout (one update of 32 per 4 agent steps, the Nature network). Every side
steps the same gymnasium env (this project's preprocessing: ``make_gym_env``), acts epsilon-greedily with the
same network (the encoder and head layers of ``rl_lightning.nn``), trains it with Adam on the Huber loss
and copies the target every ``hard_update_every`` updates, with one torch thread. Epsilon decays over the
warm-up, so the timed frames are those of most of a run, where the network picks the actions (epsilon
0.1 on MinAtar, 0.01 on Atari). The replay holds
``--buffer`` transitions on every side (Stable-Baselines3 allocates its whole buffer of observation and next
observation up front: 100k Atari transitions would be 5.6 GB there).

- ``rl_lightning``: ``python -m rl_lightning fit +experiment=RECIPE`` to ``W + F`` frames (``W`` random
  warm-up frames) with the CSV logger; its frames/s over the throughput monitor's windows after the warm-up
  (``time/env_sps`` against ``time/frames``): start-up, warm-up and the final evaluation are outside them.
- ``hand_written``: the textbook loop in this process (the CleanRL ``dqn_atari.py`` shape): a numpy ring of
  uint8 observations and next observations, a random batch of 32, the TD update; timed over ``F`` frames
  after ``W``.
- ``sb3``: Stable-Baselines3's ``DQN`` (``pip install 'rl_lightning[compare]'``) with the same
  hyperparameters and the same network as its features extractor and head; timed by a callback from frame
  ``W`` to ``W + F``.

The sides alternate for ``--rounds`` rounds; each side's figure is its best round (the least disturbed by
other load), and the ratios are to rl_lightning's.

    python benchmarks/image_dqn_speed.py [--games minatar atari] [--rounds 2] [--buffer 20000]

Writes ``benchmarks/results/image_dqn_speed.json``.
"""

from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from _common import cli, write
from torch import nn

from rl_lightning.cli import compose
from rl_lightning.cli.run import env_config
from rl_lightning.envs.factory import make_env, make_gym_env
from rl_lightning.nn.actor_critic import mlp_head
from rl_lightning.nn.encoders import make_encoder

#: Each recipe's experiment, the frames timed (F) and the random warm-up frames (W).
GAMES = {
    "minatar": {
        "experiment": "dqn_minatar",
        "env_id": "MinAtar/Breakout-v1",
        "frames": 20_000,
        "warmup": 5_000,
    },
    "atari": {"experiment": "dqn_atari_cpu", "env_id": "ALE/Breakout-v5", "frames": 4_000, "warmup": 10_000},
}


def recipe(game: str, buffer: int, scale: float) -> dict[str, Any]:
    """The hyperparameters every side uses, read from the experiment's config."""
    g = {**GAMES[game]}
    g["frames"], g["warmup"] = int(g["frames"] * scale), int(g["warmup"] * scale)
    cfg = compose([f"+experiment={g['experiment']}", f"env.id={g['env_id']}", "device=cpu"])
    upf = float(cfg.collect.updates_per_frame)
    return {
        # Episodes bounded alike on every side (Breakout without FIRE only ends at the ALE's 27k steps).
        "env": dataclasses.replace(env_config(cfg), max_episode_steps=MAX_EPISODE_STEPS),
        "train_every": round(1 / upf),
        "batch": int(cfg.replay.batch_size),
        "buffer": buffer,
        "lr": float(cfg.algo.lr),
        "gamma": float(cfg.algo.gamma),
        "target_every": int(cfg.algo.hard_update_every),
        # Epsilon reaches its final value by the end of the warm-up on every side: the timed frames are the
        # regime of most of a run, where the network picks the action (a loop that skips the forward pass
        # on exploring steps would otherwise be timed on steps that are mostly random).
        "eps": (float(cfg.algo.eps_start), float(cfg.algo.eps_end), g["warmup"]),
        "hidden": [int(w) for w in cfg.algo.hidden_sizes],
        "encoder": str(cfg.algo.encoder),
        "grad_clip": cfg.algo.grad_clip,
        **g,
    }


MAX_EPISODE_STEPS = 2000


def q_network(r: dict[str, Any], n_actions: int) -> nn.Module:
    spec = make_env(r["env"], num_envs=1).observation_spec["observation"]
    encoder = make_encoder(r["encoder"], spec)
    return nn.Sequential(encoder, mlp_head(encoder.out_features, n_actions, r["hidden"]))


def epsilon(r: dict[str, Any], frame: int) -> float:
    start, end, decay = r["eps"]
    return end + (start - end) * max(0.0, 1 - frame / decay)


def run_ours(r: dict[str, Any], workdir: Path) -> dict[str, float]:
    """One fit of ``W + F`` frames with the CSV logger; frames/s from the throughput windows after the warm-up
    (frames over the windows' time: start-up, warm-up and the final evaluation are outside them)."""
    workdir.mkdir(parents=True, exist_ok=True)
    args = [f"+experiment={r['experiment']}", f"env.id={r['env_id']}",
            f"total_frames={r['warmup'] + r['frames']}",
            f"collect.warmup_frames={r['warmup']}", f"replay.capacity={r['buffer']}", "logger=csv",
            "progress_bar=false", "eval.every_frames=0", "eval.episodes=1", "device=cpu",
            f"env.max_episode_steps={MAX_EPISODE_STEPS}", f"algo.eps_decay_frames={r['eps'][2]}"]  # fmt: skip
    summary = json.loads(cli(workdir, workdir / "log.txt", "fit", *args))
    with (workdir / summary["run_dir"] / "csv" / "metrics.csv").open() as fh:
        windows = [(float(w["time/frames"]), float(w["time/env_sps"])) for w in csv.DictReader(fh)
                   if w.get("time/env_sps")]  # fmt: skip
    if len(windows) < 2:  # too short a run for two windows: the one window's own rate
        return {"frames_per_s": windows[0][1], "frames_measured": None}
    frames = [f for f, _ in windows]
    seconds = sum((b - a) / sps for a, (b, sps) in zip(frames, windows[1:]))
    return {"frames_per_s": (frames[-1] - frames[0]) / seconds, "frames_measured": frames[-1] - frames[0]}


def run_hand_written(r: dict[str, Any], seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    env = make_gym_env(r["env"])
    n_actions = int(env.action_space.n)
    q = q_network(r, n_actions)
    target = copy.deepcopy(q).requires_grad_(False)
    opt = torch.optim.Adam(q.parameters(), lr=r["lr"])
    shape = env.observation_space.shape
    obs_buf = np.zeros((r["buffer"], *shape), np.uint8)
    next_buf = np.zeros((r["buffer"], *shape), np.uint8)
    act_buf = np.zeros(r["buffer"], np.int64)
    rew_buf = np.zeros(r["buffer"], np.float32)
    term_buf = np.zeros(r["buffer"], np.float32)
    obs, _ = env.reset(seed=seed)
    updates, start = 0, None
    for frame in range(r["warmup"] + r["frames"]):
        if frame == r["warmup"]:
            start = time.perf_counter()
        if frame < r["warmup"] or rng.random() < epsilon(r, frame):
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(q(torch.from_numpy(np.asarray(obs))[None]).argmax(-1))
        next_obs, reward, terminated, truncated, _ = env.step(action)
        i = frame % r["buffer"]
        obs_buf[i], next_buf[i], act_buf[i] = obs, next_obs, action
        rew_buf[i], term_buf[i] = np.sign(reward) if r["env"].reward_clip else reward, float(terminated)
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
        if frame >= r["warmup"] and frame % r["train_every"] == 0:
            idx = rng.integers(0, min(frame + 1, r["buffer"]), r["batch"])
            o, n = torch.from_numpy(obs_buf[idx]), torch.from_numpy(next_buf[idx])
            with torch.no_grad():
                y = torch.from_numpy(rew_buf[idx]) + r["gamma"] * target(n).max(-1).values * (
                    1 - torch.from_numpy(term_buf[idx])
                )
            pred = q(o).gather(-1, torch.from_numpy(act_buf[idx])[:, None]).squeeze(-1)
            loss = F.smooth_l1_loss(pred, y)
            opt.zero_grad()
            loss.backward()
            if r["grad_clip"] is not None:
                nn.utils.clip_grad_norm_(q.parameters(), r["grad_clip"])
            opt.step()
            updates += 1
            if updates % r["target_every"] == 0:
                target.load_state_dict(q.state_dict())
    env.close()
    return {"frames_per_s": r["frames"] / (time.perf_counter() - start)}


def run_sb3(r: dict[str, Any], seed: int = 0) -> dict[str, float] | None:
    try:
        from stable_baselines3 import DQN
        from stable_baselines3.common.callbacks import BaseCallback
        from stable_baselines3.common.torch_layers import BaseFeaturesExtractor
    except ImportError:
        return None
    spec = make_env(r["env"], num_envs=1).observation_spec["observation"]

    class Encoder(BaseFeaturesExtractor):
        """The same torso as the other sides (SB3's NatureCNN needs 36 pixels a side: not MinAtar's grid)."""

        def __init__(self, space: Any) -> None:
            encoder = make_encoder(r["encoder"], spec)
            super().__init__(space, encoder.out_features)
            self.encoder = encoder

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.encoder(x)

    class Clock(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.start = self.end = None

        def _on_step(self) -> bool:
            if self.num_timesteps == r["warmup"]:
                self.start = time.perf_counter()
            self.end = time.perf_counter()
            return True

    start, end, decay = r["eps"]
    total = r["warmup"] + r["frames"]
    env = make_gym_env(r["env"])
    if r["env"].reward_clip:
        env = gym.wrappers.TransformReward(env, np.sign)
    model = DQN(
        "CnnPolicy", env, learning_rate=r["lr"], buffer_size=r["buffer"],
        learning_starts=r["warmup"], batch_size=r["batch"], gamma=r["gamma"], train_freq=r["train_every"],
        gradient_steps=1, target_update_interval=r["target_every"] * r["train_every"],
        exploration_initial_eps=start, exploration_final_eps=end, exploration_fraction=decay / total,
        max_grad_norm=r["grad_clip"] or 1e9, optimize_memory_usage=False, seed=seed, device="cpu",
        policy_kwargs={"features_extractor_class": Encoder, "net_arch": r["hidden"],
                       "normalize_images": False,
                       "optimizer_class": torch.optim.Adam},
    )  # fmt: skip
    clock = Clock()
    model.learn(total_timesteps=total, callback=clock)
    return {"frames_per_s": r["frames"] / (clock.end - clock.start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--buffer", type=int, default=20_000)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiplies the frames timed and the warm-up"
    )
    parser.add_argument(
        "--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_image_speed"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for game in args.games:
        r = recipe(game, args.buffer, args.scale)
        rounds: dict[str, list] = {"rl_lightning": [], "hand_written": [], "sb3": []}
        for k in range(args.rounds):
            rounds["rl_lightning"].append(run_ours(r, args.workdir / game / f"round{k}"))
            rounds["hand_written"].append(run_hand_written(r))
            sb3 = run_sb3(r)
            if sb3 is not None:
                rounds["sb3"].append(sb3)
            print(game, k, {side: v[-1]["frames_per_s"] for side, v in rounds.items() if v}, flush=True)
        best = {side: max(x["frames_per_s"] for x in v) for side, v in rounds.items() if v}
        results[game] = {
            "experiment": r["experiment"],
            "env": r["env"].id,
            "frames_timed": r["frames"],
            "warmup_frames": r["warmup"],
            "updates_per_frame": 1 / r["train_every"],
            "frames_per_s": {side: round(v, 1) for side, v in best.items()},
            "ratio_to_rl_lightning": {side: round(v / best["rl_lightning"], 3) for side, v in best.items()},
            "rounds": rounds,
        }
    write("image_dqn_speed", {"buffer": args.buffer, "games": results})


if __name__ == "__main__":
    main()
