"""A GPU replay's slice samples while the device works: the index drawn on the host against on the device.

On a GPU, TD-MPC2's updates run as CUDA graphs: the host queues one and goes on to the next sample while the
device runs it. The project's slice samplers draw a sample's index on the host, from trajectory ends and runs
kept there, and copy it over asynchronously (``rl_lightning/data/slices.py``). Drawn on the device, as
TorchRL's ``SliceSampler`` does from a GPU storage (and the project's samplers did before), the draw's checks
and masks read device tensors, and each such read waits for the update queued before it.

One cycle is a collection and its updates, as TD-MPC2's data path runs them: write one step of each env,
then, per update, sample ``--batch`` steps and queue a stand-in update of about ``--load-ms`` of device work
(a chain of matrix products that reads the sample). ``host`` is the samplers as they are; ``device`` is the
same samplers with the ends or runs moved to the storage's device before the draw (the earlier behaviour);
``round`` is the samplers as they are with the cycle's samples drawn as training draws them, by the data
module's ``UpdateRound`` (all the updates of a collection in one call, then split). Each variant has a buffer
of its own with the same data, and the variants alternate in blocks in one process. The figures: the median
ms per update of each over the blocks, the ratios, and each one's ms per sample with no device work queued (a
synchronisation before and after each sample, or each round of samples for ``round``).

Usage: python benchmarks/replay_overlap.py [--device cuda] [--num-envs 1 8] [--fill 20000] [--batch 768]
    [--slice-len 3] [--load-ms 1.5] [--cycles 20] [--blocks 4] [--out PATH]
Writes ``benchmarks/results/replay_overlap_<device>.json`` unless ``--out`` says otherwise. On a CPU ``host``
and ``device`` are the same (nothing to overlap), and ``round`` against ``host`` is the host's cost per
sample.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from _common import RESULTS, write
from slice_sampler import rows
from torchrl.data import TensorDictReplayBuffer

from rl_lightning.data.budget import FrameBudget
from rl_lightning.data.replay import TRAJ_KEY
from rl_lightning.data.slices import InterleavedSliceSampler, TrajectorySliceSampler, _SortedRunIndex
from rl_lightning.data.storage import DirectTensorStorage
from rl_lightning.data.stream import UpdateRound
from rl_lightning.data.transfer import DeviceCopies


class _DeviceRuns(_SortedRunIndex):
    """The interleaved envs' runs on the storage's device, moved once per write (as they were kept)."""

    _moved: tuple[Any, tuple[torch.Tensor, ...]] | None = None

    def runs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        runs = super().runs()
        if self._moved is None or self._moved[0] is not runs:
            self._moved = runs, tuple(t.to(self._device) for t in runs)
        return self._moved[1]


class _DeviceInterleaved(InterleavedSliceSampler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._fragmented_index = _DeviceRuns(self.traj_key, self.step_key)


class _DeviceAdjacent(TrajectorySliceSampler):
    def _get_stop_and_length(self, storage: Any, fallback: bool = True) -> Any:
        return tuple(t.to(storage.device) for t in super()._get_stop_and_length(storage, fallback))


VARIANTS = ("device", "host", "round")


def buffer(variant: str, num_envs: int, args: argparse.Namespace) -> TensorDictReplayBuffer:
    fragmented = num_envs > 1
    drawn_on = "device" if variant == "device" else "host"  # round: the host samplers, drawn by rounds
    cls = {
        ("host", False): TrajectorySliceSampler,
        ("host", True): InterleavedSliceSampler,
        ("device", False): _DeviceAdjacent,
        ("device", True): _DeviceInterleaved,
    }[drawn_on, fragmented]
    mode = {"fragmented": True, "step_key": "step_count"} if fragmented else {}
    sampler = cls(slice_len=args.slice_len, traj_key=TRAJ_KEY, strict_length=True, **mode)
    storage = DirectTensorStorage(args.fill * 2, device=args.device)
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, batch_size=args.batch)


class Load:
    """About ``ms`` of device work that reads a sample: a chain of ``[n x n]`` matrix products."""

    def __init__(self, device: torch.device, ms: float, n: int = 1024) -> None:
        self.device = device
        self.weight = torch.randn(n, n, device=device) / n**0.5
        self.x = torch.randn(n, n, device=device)
        self.steps = 1
        one_step_ms = 1e3 * self._timed(20) / 20
        self.steps = max(1, round(ms / one_step_ms))
        self.ms = 1e3 * self._timed(10) / 10

    def __call__(self, sample: Any) -> None:
        x = self.x + sample["observation"].mean()
        for _ in range(self.steps):
            x = torch.tanh(x @ self.weight)
        self.x = x

    def _timed(self, calls: int) -> float:
        sample = {"observation": torch.zeros(1, device=self.device)}
        self(sample)
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(calls):
            self(sample)
        _sync(self.device)
        return time.perf_counter() - start


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def samples(variant: str, rb: TensorDictReplayBuffer, n: int) -> Any:
    """The ``n`` samples of a collection's updates: one by one, or by an ``UpdateRound`` as training draws
    them."""
    if variant != "round":
        return (rb.sample() for _ in range(n))
    device = rb.storage.device
    stream = SimpleNamespace(
        replay=rb, copies=DeviceCopies(device, device), batch_size=rb.batch_size,
        budget=FrameBudget(total_frames=n, owed=n), control=SimpleNamespace(stop_now=lambda local: False),
    )  # fmt: skip
    return iter(UpdateRound(stream, n))


def measure(num_envs: int, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    buffers = {v: buffer(v, num_envs, args) for v in VARIANTS}
    t = 0
    while t * num_envs < args.fill:
        chunk = rows(t, min(5_000, -(-(args.fill - t * num_envs) // num_envs)), num_envs).to(device)
        t += chunk.numel() // num_envs
        for rb in buffers.values():
            rb.extend(chunk)
    load = Load(device, args.load_ms)
    updates = num_envs  # one update per env frame
    per_update: dict[str, list[float]] = {v: [] for v in VARIANTS}
    idle: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for block in range(args.blocks + 1):  # the first block warms up
        order = VARIANTS if block % 2 else VARIANTS[::-1]
        for variant in order:
            rb, block_t = buffers[variant], t
            idle_n = updates if variant == "round" else 1  # samples per timed draw with no device work
            _sync(device)
            start = time.perf_counter()
            for _ in range(args.cycles):
                rb.extend(rows(block_t, 1, num_envs).to(device))
                block_t += 1
                for sample in samples(variant, rb, updates):
                    load(sample)
            _sync(device)
            if block:
                per_update[variant].append(1e3 * (time.perf_counter() - start) / (args.cycles * updates))
            for _ in range(5):
                _sync(device)
                start = time.perf_counter()
                for _ in samples(variant, rb, idle_n):
                    pass
                _sync(device)
                if block:
                    idle[variant].append(1e3 * (time.perf_counter() - start) / idle_n)
        t = block_t
    ms = {v: statistics.median(per_update[v]) for v in VARIANTS}
    result = {
        "num_envs": num_envs,
        "sampler": type(buffers["host"].sampler).__name__,
        "fill": len(buffers["host"]),
        "load_ms": round(load.ms, 3),
        "ms_per_update": {v: round(ms[v], 3) for v in VARIANTS},
        "host_over_device": round(ms["host"] / ms["device"], 3),
        "round_over_host": round(ms["round"] / ms["host"], 3),
        "ms_per_sample_idle": {v: round(statistics.median(idle[v]), 3) for v in VARIANTS},
    }
    print(json.dumps(result), flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--fill", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=768, help="steps per sample (TD-MPC2's 256 x 3)")
    parser.add_argument("--slice-len", type=int, default=3)
    parser.add_argument("--load-ms", type=float, default=1.5, help="device work per stand-in update")
    parser.add_argument("--cycles", type=int, default=20, help="collections per block")
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = [measure(n, args) for n in args.num_envs]
    name = "cpu" if args.device == "cpu" else torch.cuda.get_device_name(torch.device(args.device))
    out = args.out or RESULTS / f"replay_overlap_{name.lower().replace(' ', '_')}.json"
    payload = {
        "what": (
            "ms per update of a collection cycle (write one step of each env; per update, sample and queue "
            "about load_ms of device work), the slices' index drawn on the host (host, as the samplers are) "
            "or on the device (device, as before), or on the host for all the cycle's updates at once "
            "(round, as training draws them); ms per sample with no device work queued"
        ),
        "device": name,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "results": results,
    }
    print(f"written to {write('replay_overlap', payload, out)}")


if __name__ == "__main__":
    main()
