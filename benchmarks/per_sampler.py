"""Prioritized replay on the same work: TorchRL's ``PrioritizedSampler`` vs our ``TensorPrioritizedSampler``.

Both sit in a ``TensorDictReplayBuffer`` over the same ``LazyTensorStorage`` (100k transitions by default,
filled), and each timed step is what a prioritized update costs the data path: sample a batch of 256 and
write back new priorities for it. Steps alternate between the two samplers in blocks (interleaved, so load
from other processes hits both), warm-up excluded; the figure is the median microseconds per step.
TorchRL's sampler needs its compiled extension, which is built for one torch release: where it does not
load, the result says so.

    python benchmarks/per_sampler.py [--capacity 100000] [--batch 256] [--blocks 10] [--steps 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _common import write

from rl_lightning.data.per import TensorPrioritizedSampler


def make_buffer(sampler, capacity: int, batch: int) -> TensorDictReplayBuffer:
    rb = TensorDictReplayBuffer(
        storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=batch, priority_key="td_error"
    )
    g = torch.Generator().manual_seed(0)
    data = TensorDict(
        {"observation": torch.randn(capacity, 4, generator=g), "action": torch.randint(0, 2, (capacity,))},
        [capacity],
    )
    rb.extend(data)
    return rb


def step(rb: TensorDictReplayBuffer, g: torch.Generator) -> None:
    sample = rb.sample()
    rb.update_priority(sample["index"], torch.rand(sample.shape[0], generator=g) * 10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--beta", type=float, default=0.4)
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    samplers = {
        "TensorPrioritizedSampler": lambda: TensorPrioritizedSampler(
            args.capacity, args.alpha, args.beta, batch_size=args.batch
        ),
    }
    result: dict = {"settings": vars(args), "torch": torch.__version__, "samplers": {}}
    try:
        from torchrl.data import PrioritizedSampler

        PrioritizedSampler(args.capacity, args.alpha, args.beta)  # fails where the extension does not load
        samplers["torchrl.PrioritizedSampler"] = lambda: PrioritizedSampler(
            args.capacity, args.alpha, args.beta
        )
    except Exception as e:  # the compiled extension of another torch release
        result["samplers"]["torchrl.PrioritizedSampler"] = {
            "status": f"unavailable: {str(e).splitlines()[0]}"
        }
    buffers = {name: make_buffer(make(), args.capacity, args.batch) for name, make in samplers.items()}
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {name: [] for name in buffers}
    for rb in buffers.values():  # warm-up
        for _ in range(20):
            step(rb, g)
    for _ in range(args.blocks):
        for name, rb in buffers.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                step(rb, g)
            times[name].append((time.perf_counter() - start) / args.steps * 1e6)
    for name, per_block in times.items():
        result["samplers"][name] = {
            "status": "ok",
            "us_per_sample_and_update_median": statistics.median(per_block),
            "us_per_block": per_block,
        }
    ok = {k: v for k, v in result["samplers"].items() if v["status"] == "ok"}
    if len(ok) == 2:
        ours = ok["TensorPrioritizedSampler"]["us_per_sample_and_update_median"]
        theirs = ok["torchrl.PrioritizedSampler"]["us_per_sample_and_update_median"]
        result["torchrl_over_ours"] = theirs / ours
    for name, r in result["samplers"].items():
        print(name, r.get("us_per_sample_and_update_median", r["status"]))
    print(write(f"per_sampler_torch{torch.__version__.split('+')[0]}_{args.capacity}", result))


if __name__ == "__main__":
    main()
