"""Collection throughput: the TorchRL collector over our GymVecEnv vs raw gymnasium vector stepping.

Frames/s of ``torchrl.collectors.Collector`` over ``make_env(CartPole-v1, num_envs=16)`` with a batched
random policy (the collector's own work, as in a run), against gymnasium's ``SyncVectorEnv`` (autoreset
SAME_STEP) stepping the same 16 envs with random actions and nothing else. For reference, the plain TorchRL
route: ``GymWrapper`` over the same ``SyncVectorEnv``. The variants alternate in blocks in one process and
the best block of each is kept; the first batch (warm-up) is excluded.

    python benchmarks/collection.py [--num-envs 16] [--seconds 3] [--blocks 3]
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from _common import write
from tensordict import TensorDictBase
from torchrl.collectors import Collector
from torchrl.envs import GymWrapper

from rl_lightning.envs import EnvConfig, make_env


class RandomBatchedPolicy:
    """One batched call per step, like an algorithm's ``act``."""

    def __init__(self, n_actions: int) -> None:
        self.n_actions = n_actions

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        td.set("action", torch.randint(0, self.n_actions, td.batch_size))
        return td


def raw_gymnasium(n: int, seconds: float) -> float:
    env = gym.vector.SyncVectorEnv(
        [lambda: gym.make("CartPole-v1") for _ in range(n)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    env.reset(seed=0)
    env.action_space.seed(0)
    frames, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(env.action_space.sample())
        frames += n
    env.close()
    return frames / (time.perf_counter() - t0)


def through_collector(env, seconds: float, frames_per_batch: int, **kwargs) -> float:
    collector = Collector(
        env, RandomBatchedPolicy(2), frames_per_batch=frames_per_batch, total_frames=-1, **kwargs
    )
    it = iter(collector)
    next(it)  # warm-up
    frames, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        frames += next(it).numel()
    rate = frames / (time.perf_counter() - t0)
    collector.shutdown()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--blocks", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, fpb = args.num_envs, args.num_envs * 16
    raw, ours, plain = [], [], []
    for _ in range(args.blocks):
        raw.append(raw_gymnasium(n, args.seconds))
        ours.append(
            through_collector(
                make_env(EnvConfig(id="CartPole-v1", num_envs=n), seed=0),
                args.seconds,
                fpb,
                trust_policy=True,
                track_traj_ids=False,
                # The devices the data module gives its collector on a CPU run (no per-step casts).
                env_device="cpu",
                policy_device="cpu",
                storing_device="cpu",
            )
        )
        wrapped = GymWrapper(
            gym.vector.SyncVectorEnv(
                [lambda: gym.make("CartPole-v1") for _ in range(n)],
                autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
            ),
            categorical_action_encoding=True,
        )
        plain.append(through_collector(wrapped, args.seconds, fpb))
    result = {
        "frames_per_s": {
            "raw_gymnasium": max(raw),
            "rl_lightning": max(ours),
            "torchrl_gymwrapper": max(plain),
        },
        "ratio_rl_lightning": max(ours) / max(raw),
        "ratio_torchrl_gymwrapper": max(plain) / max(raw),
        "settings": vars(args) | {"frames_per_batch": fpb, "env": "CartPole-v1"},
    }
    path = write("collection", result)
    print(f"raw gymnasium  {max(raw):9.0f} frames/s")
    print(f"rl_lightning   {max(ours):9.0f} frames/s  ratio {result['ratio_rl_lightning']:.2f}")
    print(f"TorchRL plain  {max(plain):9.0f} frames/s  ratio {result['ratio_torchrl_gymwrapper']:.2f}")
    print(path)


if __name__ == "__main__":
    main()
