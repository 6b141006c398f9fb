"""Sub-trajectory sampling: TorchRL's ``SliceSampler`` against the project's, at several buffer fills.

- Interleaved envs (``--num-envs``, fragmented mode): ``InterleavedSliceSampler``, its index kept sorted
  across writes, and reading only the flags it needs.
- One env, adjacent steps: ``TrajectorySliceSampler``, which reads only the flags it needs
  (``--adjacent-batch`` steps per sample, TD-MPC2's ``[256 x 3]``).

One cycle is what TD-MPC2 does per collection: write one step of each env (``[num_envs]`` rows, env-major,
as the data module writes them) and sample one batch of slices. Both buffers get the same
data; their cycles alternate in blocks in one process, so load from other processes hits both, and the
figure per fill is the median cycle time of each and their ratio. Episodes are 251 steps (hockey's), their
starts staggered across envs.

Usage: python benchmarks/slice_sampler.py [--fills 20000 100000 1000000] [--num-envs 4] [--batch 96]
    [--adjacent-batch 768] [--slice-len 3] [--cycles 40] [--blocks 4]
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
from rl_lightning.data.slices import InterleavedSliceSampler, TrajectorySliceSampler
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


def buffer(
    sampler_cls: type, capacity: int, slice_len: int, batch: int, fragmented: bool
) -> TensorDictReplayBuffer:
    mode = {"fragmented": True, "step_key": "step_count"} if fragmented else {}
    sampler = sampler_cls(slice_len=slice_len, traj_key=TRAJ_KEY, strict_length=True, **mode)
    return TensorDictReplayBuffer(storage=DirectTensorStorage(capacity), sampler=sampler, batch_size=batch)


def compare(ours: type, fragmented: bool, num_envs: int, batch: int, args: argparse.Namespace) -> list[dict]:
    """Median ms per cycle of TorchRL's ``SliceSampler`` and ``ours`` at each fill of ``args.fills``."""
    capacity = max(args.fills)
    names = ("torchrl", "ours")
    buffers = {name: buffer(cls, capacity, args.slice_len, batch, fragmented)
               for name, cls in zip(names, (SliceSampler, ours), strict=True)}  # fmt: skip
    t, results = 0, []
    for fill in sorted(args.fills):
        while t * num_envs < fill:
            chunk = rows(t, min(10_000, -(-(fill - t * num_envs) // num_envs)), num_envs)
            t += chunk.numel() // num_envs
            for rb in buffers.values():
                rb.extend(chunk)
        times: dict[str, list[float]] = {name: [] for name in names}
        for block in range(args.blocks + 1):  # the first block warms up (the full rebuild after the fill)
            for name in names if block % 2 else reversed(names):
                rb, block_t = buffers[name], t
                for _ in range(args.cycles):
                    data = rows(block_t, 1, num_envs)
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
            "ours_ms_per_cycle": round(ms["ours"], 3),
            "speedup": round(ms["torchrl"] / ms["ours"], 2),
        })  # fmt: skip
        print(ours.__name__, results[-1], flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fills", type=int, nargs="+", default=[20_000, 100_000, 1_000_000])
    parser.add_argument("--num-envs", type=int, default=4, help="envs of the interleaved comparison")
    parser.add_argument("--batch", type=int, default=96, help="steps per sample, interleaved comparison")
    parser.add_argument("--adjacent-batch", type=int, default=768, help="steps per sample, one env")
    parser.add_argument("--slice-len", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=40, help="cycles per block")
    parser.add_argument("--blocks", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    interleaved = compare(InterleavedSliceSampler, True, args.num_envs, args.batch, args)
    adjacent = compare(TrajectorySliceSampler, False, 1, args.adjacent_batch, args)
    write(
        "slice_sampler",
        {
            "what": "ms per cycle (extend one step of each env, then sample one batch of slices), median",
            "settings": {k: v for k, v in vars(args).items() if k != "fills"} | {"capacity": max(args.fills)},
            "interleaved": {
                "sampler": "InterleavedSliceSampler",
                "num_envs": args.num_envs,
                "results": interleaved,
            },
            "adjacent": {"sampler": "TrajectorySliceSampler", "num_envs": 1, "results": adjacent},
        },
    )


if __name__ == "__main__":
    main()
