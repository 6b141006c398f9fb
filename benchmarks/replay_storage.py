"""Replay writes and reads: TorchRL's ``LazyTensorStorage`` against the project's ``DirectTensorStorage``.

Two ``TensorDictReplayBuffer`` with uniform sampling over 1M transitions of Pendulum's shapes (the keys SAC
stores: observation, action, next observation, reward, terminated), filled with 20k of them; then, in
alternating blocks in one process, one-frame ``extend`` calls (SAC's write of each collected frame) and
``[256]`` ``sample`` calls (each update's read), the best block of each kept. One torch thread. Then the
same for sub-trajectory samples (TorchRL's ``SliceSampler``, TD-MPC2's ``[256 x 3]`` steps) over 20k
transitions in episodes of 251 steps: the sampler reads the sampled steps' done flags and the buffer the
sample, each at a tuple of one index tensor.

    python benchmarks/replay_storage.py [--calls 2000] [--blocks 5]

Writes ``benchmarks/results/replay_storage.json``.
"""

from __future__ import annotations

import argparse
import time

import torch
from _common import write
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import RandomSampler, SliceSampler

from rl_lightning.data.storage import DirectTensorStorage

CAPACITY, FILLED, BATCH = 1_000_000, 20_000, 256
SLICE_LEN, EPISODE = 3, 251
STORAGES = {"lazy_tensor_storage": LazyTensorStorage, "direct_tensor_storage": DirectTensorStorage}


def transitions(n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(n, 3, generator=g),
            "action": torch.randn(n, 1, generator=g),
            "next": {
                "observation": torch.randn(n, 3, generator=g),
                "reward": torch.randn(n, 1, generator=g),
                "terminated": torch.zeros(n, 1, dtype=torch.bool),
            },
        },
        batch_size=[n],
    )


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    buffers = {
        name: TensorDictReplayBuffer(
            storage=cls(CAPACITY), sampler=RandomSampler(), batch_size=BATCH, priority_key="td_error"
        )
        for name, cls in (
            ("lazy_tensor_storage", LazyTensorStorage),
            ("direct_tensor_storage", DirectTensorStorage),
        )
    }
    frame = transitions(1, seed=1)
    for rb in buffers.values():
        rb.extend(transitions(FILLED, seed=0))
        for _ in range(100):  # warm-up
            rb.extend(frame)
            rb.sample()
    extend = {name: [] for name in buffers}
    sample = {name: [] for name in buffers}
    for _ in range(args.blocks):
        for name, rb in buffers.items():
            extend[name].append(per_call_us(lambda rb=rb: rb.extend(frame), args.calls))
            sample[name].append(per_call_us(rb.sample, args.calls))
    best_extend = {name: min(v) for name, v in extend.items()}
    best_sample = {name: min(v) for name, v in sample.items()}
    slices = {
        name: TensorDictReplayBuffer(
            storage=cls(CAPACITY),
            sampler=SliceSampler(slice_len=SLICE_LEN, traj_key=("collector", "traj_ids"), strict_length=True),
            batch_size=BATCH * SLICE_LEN,
        )
        for name, cls in STORAGES.items()
    }
    episodes = transitions(FILLED, seed=0)
    episodes.set(("collector", "traj_ids"), torch.arange(FILLED) // EPISODE)
    slice_sample = {name: [] for name in slices}
    for rb in slices.values():
        rb.extend(episodes)
        for _ in range(20):
            rb.sample()
    for _ in range(args.blocks):
        for name, rb in slices.items():
            slice_sample[name].append(per_call_us(rb.sample, max(1, args.calls // 10)))
    best_slice = {name: min(v) for name, v in slice_sample.items()}
    result = {
        "one_frame_extend_us": best_extend,
        "sample_256_us": best_sample,
        "extend_ratio": best_extend["direct_tensor_storage"] / best_extend["lazy_tensor_storage"],
        "sample_ratio": best_sample["direct_tensor_storage"] / best_sample["lazy_tensor_storage"],
        "slice_sample_256x3_us": best_slice,
        "slice_sample_ratio": best_slice["direct_tensor_storage"] / best_slice["lazy_tensor_storage"],
        "settings": vars(args) | {"capacity": CAPACITY, "filled": FILLED, "batch": BATCH, "threads": 1},
    }
    path = write("replay_storage", result)
    for name in buffers:
        print(
            f"{name:22s} extend {best_extend[name]:6.1f} us   sample {best_sample[name]:6.1f} us   "
            f"slice sample {best_slice[name]:6.1f} us"
        )
    print(path)


if __name__ == "__main__":
    main()
