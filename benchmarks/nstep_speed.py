"""The n-step step of the ingestion: its cost per collection, against the code of an earlier revision.

The real MinAtar env is stepped with random actions through the real collector, four frames per collection
as in ``rainbow_minatar``, and each batch has its observations replaced by frame serials (``FrameReplay``)
as the ingestion does. The same batches then go, in alternating rounds, through:

- ``before``: ``NStepReturns`` of ``--before`` (read with ``git show``), with every entry of the batch;
- ``after``: this tree's ``NStepReturns`` with the keys the replay stores (what ``Ingestion`` passes);
- ``after_all_keys``: this tree's, with every entry (the share of the saving that is not the key choice).

Each variant's transitions are checked equal to ``before``'s on the stored keys. Reported: microseconds per
call (median of the rounds) and the ratios to ``before``.

    python benchmarks/nstep_speed.py --before 03cf359 [--collections 500] [--rounds 7]

Writes ``benchmarks/results/nstep.json``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from _common import module_at, write
from torchrl.collectors import Collector

from rl_lightning.algos.base import TRANSITION_KEYS
from rl_lightning.data.frames import FrameReplay, frame_keys
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.replay import ReplayConfig, make_replay_buffer
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.factory import EnvConfig, make_env

CPU = torch.device("cpu")
#: What ``Ingestion`` stores for the DQN family with n-step returns and frames.
STORED = (*frame_keys(TRANSITION_KEYS), "steps_to_next_obs")


def collect(collections: int) -> list:
    """``collections`` MinAtar Breakout batches of four frames, observations replaced by frame serials."""
    cfg = EnvConfig(id="MinAtar/Breakout-v1", preprocess="minatar")
    env = make_env(cfg, num_envs=1)
    spec = env.observation_spec["observation"]
    buffer = make_replay_buffer(ReplayConfig(capacity=100_000, batch_size=32, device="cpu"))
    frames = FrameReplay(buffer, tuple(spec.shape[1:]), 1, DeviceCopies(CPU, CPU), dtype=spec.dtype)
    collector = Collector(env, None, frames_per_batch=4, total_frames=4 * collections)
    batches = [frames.index(batch.clone()) for batch in collector]
    collector.shutdown()
    return batches


def run(cls: type, batches: list, keys) -> tuple[float, list]:
    nstep = cls(3, 0.99)
    start = time.perf_counter()
    outs = [nstep(b) if keys is None else nstep(b, keys) for b in batches]
    return (time.perf_counter() - start) / len(batches), outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the revision to compare with")
    parser.add_argument("--collections", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    batches = collect(args.collections)
    old = module_at(args.before, "rl_lightning/data/nstep.py").NStepReturns
    variants = {
        "before": (old, None),
        "after": (NStepReturns, STORED),
        "after_all_keys": (NStepReturns, None),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    _, reference = run(variants["before"][0], batches, None)
    for name, (cls, keys) in variants.items():  # warm-up, and the outputs checked once
        _, outs = run(cls, batches, keys)
        for ref, out in zip(reference, outs, strict=True):
            for key in STORED:
                if key in ref.keys(True) and not torch.equal(ref.get(key), out.get(key)):
                    sys.exit(f"{name}: {key} differs from before's")
    for _ in range(args.rounds):
        for name, (cls, keys) in variants.items():
            times[name].append(run(cls, batches, keys)[0])
    us = {name: statistics.median(t) * 1e6 for name, t in times.items()}
    payload = {
        "before": args.before,
        "env": "MinAtar/Breakout-v1, 4 frames per collection, n = 3, frame serials",
        "collections": args.collections,
        "rounds": args.rounds,
        "us_per_call": {k: round(v, 1) for k, v in us.items()},
        "speedup_vs_before": {k: round(us["before"] / v, 2) for k, v in us.items() if k != "before"},
    }
    print(payload)
    write("nstep", payload)


if __name__ == "__main__":
    main()
