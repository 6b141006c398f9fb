"""Sub-trajectory sampling of interleaved envs: TorchRL's fragmented ``SliceSampler`` against
``InterleavedSliceSampler`` (its index kept sorted across writes), at several buffer fills.

One cycle is what TD-MPC2 with several envs does per collection: write one step of each env (``[num_envs]``
rows, env-major, as the data module writes them) and sample one batch of slices. Both buffers get the same
data; their cycles alternate in blocks in one process, so load from other processes hits both, and the
figure per fill is the median cycle time of each and their ratio. Episodes are 251 steps (hockey's), their
starts staggered across envs.

Usage: python benchmarks/slice_sampler.py [--fills 20000 100000 1000000] [--num-envs 4] [--batch 96]
    [--slice-len 3] [--cycles 40] [--blocks 4]
Writes ``benchmarks/results/slice_sampler.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import write
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler

from rl_lightning.data.replay import TRAJ_KEY
from rl_lightning.data.slices import InterleavedSliceSampler
from rl_lightning.data.storage import DirectTensorStorage

EPISODE = 251


def rows(t0: int, steps: int, num_envs: int) -> TensorDict:
    """Steps ``t0 .. t0 + steps - 1`` of every env, env-major; env ``e``'s episodes start ``e * 37`` later."""
    t = torch.arange(t0, t0 + steps) + 37 * torch.arange(num_envs).unsqueeze(1)
    step, traj = t % EPISODE, (t // EPISODE) * num_envs + torch.arange(num_envs).unsqueeze(1)
    n = num_envs * steps
    return TensorDict(
        {
            "observation": torch.randn(n, 18),
            "action": torch.randn(n, 4),
            "step_count": step.reshape(n, 1),
            "collector": {"traj_ids": traj.reshape(n)},
            "next": {
                "observation": torch.randn(n, 18),
                "reward": torch.randn(n, 1),
                "done": (step == EPISODE - 1).reshape(n, 1),
            },
        },
        [n],
    )


def buffer(sampler_cls: type, capacity: int, slice_len: int, batch: int) -> TensorDictReplayBuffer:
    sampler = sampler_cls(
        slice_len=slice_len, traj_key=TRAJ_KEY, strict_length=True, fragmented=True, step_key="step_count"
    )
    return TensorDictReplayBuffer(storage=DirectTensorStorage(capacity), sampler=sampler, batch_size=batch)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fills", type=int, nargs="+", default=[20_000, 100_000, 1_000_000])
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--slice-len", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=40, help="cycles per block")
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    capacity = max(args.fills)
    names = ("torchrl", "interleaved")
    buffers = dict(zip(names, (buffer(cls, capacity, args.slice_len, args.batch)
                               for cls in (SliceSampler, InterleavedSliceSampler)), strict=True))  # fmt: skip
    t, results = 0, []
    for fill in sorted(args.fills):
        while t * args.num_envs < fill:
            chunk = rows(t, min(10_000, -(-(fill - t * args.num_envs) // args.num_envs)), args.num_envs)
            t += chunk.numel() // args.num_envs
            for rb in buffers.values():
                rb.extend(chunk)
        times: dict[str, list[float]] = {name: [] for name in names}
        for block in range(args.blocks + 1):  # the first block warms up (the full rebuild after the fill)
            for name in names if block % 2 else reversed(names):
                rb, block_t = buffers[name], t
                for _ in range(args.cycles):
                    data = rows(block_t, 1, args.num_envs)
                    block_t += 1
                    start = time.perf_counter()
                    rb.extend(data)
                    rb.sample()
                    if block:
                        times[name].append(time.perf_counter() - start)
            t = block_t
        ms = {name: 1e3 * statistics.median(v) for name, v in times.items()}
        results.append({
            "fill": len(buffers["torchrl"]),
            "torchrl_ms_per_cycle": round(ms["torchrl"], 3),
            "interleaved_ms_per_cycle": round(ms["interleaved"], 3),
            "speedup": round(ms["torchrl"] / ms["interleaved"], 1),
        })  # fmt: skip
        print(results[-1], flush=True)
    write(
        "slice_sampler",
        {
            "what": "ms per cycle (extend one step of each env, then sample one batch of slices), median",
            "settings": {k: v for k, v in vars(args).items() if k != "fills"} | {"capacity": capacity},
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
