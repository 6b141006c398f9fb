"""Image replays: bytes per stored transition and the cost of a sample, frames stored once against whole rows.

For each game (Atari's 4 stacked 84x84 frames; MinAtar's grids of 4 to 10 channels) the real envs are
stepped with random actions through the real collector, and the same batches go into two replays: the
project's ``FrameReplay`` (each frame once, stacks rebuilt at sampling) and TorchRL's replay storing
``observation`` and ``("next", "observation")`` per row (what a replay of the collected data holds without
it). Reported per game:

- bytes per transition of each, from the tensors a full buffer holds (the frame ring and the transition
  rows for the frame replay; the rows for the other), and their ratio;
- for Atari, what a replay of 1M transitions allocates (the frame ring is allocated, not written, so this
  takes no memory while it runs): the issue's bound is 8 GiB;
- the time to draw a sample of 32 transitions (the stacks gathered) from each, median of blocks.

    python benchmarks/image_replay.py [--steps 4000] [--samples 2000]

Writes ``benchmarks/results/image_replay.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from _common import write
from torchrl.collectors import Collector

from rl_lightning.data.frames import FrameReplay
from rl_lightning.data.ingest import rows
from rl_lightning.data.replay import ReplayConfig, make_replay_buffer
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.factory import EnvConfig, make_env

GAMES = {
    "atari_breakout": EnvConfig(id="ALE/Breakout-v5", preprocess="atari", frame_stack=4),
    "minatar_breakout": EnvConfig(id="MinAtar/Breakout-v1", preprocess="minatar"),
    "minatar_space_invaders": EnvConfig(id="MinAtar/SpaceInvaders-v1", preprocess="minatar"),
    "minatar_seaquest": EnvConfig(id="MinAtar/Seaquest-v1", preprocess="minatar"),
}
KEYS = ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated"))
FRAME_KEYS = ("obs_frames", "action", ("next", "obs_frames"), ("next", "reward"), ("next", "terminated"))
CPU = torch.device("cpu")
GIB = 2**30


def row_bytes(buffer) -> int:
    """Bytes of one row of a written TensorDict storage."""
    return sum(v[0].numel() * v.element_size() for v in buffer.storage._storage.values(True, True))


def frame_replay(cfg: EnvConfig, capacity: int) -> FrameReplay:
    spec = make_env(cfg, num_envs=1).observation_spec["observation"]
    buffer = make_replay_buffer(ReplayConfig(capacity=capacity, batch_size=32, device="cpu"))
    return FrameReplay(
        buffer, tuple(spec.shape[1:]), cfg.frame_stack, DeviceCopies(CPU, CPU), dtype=spec.dtype
    )


def sample_us(replay, samples: int, blocks: int = 5) -> float:
    """Median over blocks of the microseconds a sample of 32 takes."""
    times = []
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(samples // blocks):
            replay.sample(32)
        times.append((time.perf_counter() - start) / (samples // blocks) * 1e6)
    return statistics.median(times)


def measure(name: str, cfg: EnvConfig, steps: int, samples: int) -> dict:
    env = make_env(cfg, seed=0, train=True)
    collector = Collector(env, None, frames_per_batch=4, total_frames=steps, storing_device="cpu")
    plain = make_replay_buffer(ReplayConfig(capacity=steps, batch_size=32, device="cpu"))
    frames = frame_replay(cfg, steps)
    episodes = 0
    for batch in collector:
        episodes += int(batch.get(("next", "done")).sum())
        plain.extend(rows(batch, KEYS))
        frames.extend(rows(frames.index(batch.clone()), FRAME_KEYS))
    collector.shutdown()
    frame_bytes = frames.store.frames[0].numel() * frames.store.frames.element_size()
    ours = frames.store.frames.nbytes / steps + row_bytes(frames.buffer)
    naive = row_bytes(plain)
    out = {
        "observation_shape": list(frames.obs_shape),
        "frame_bytes": frame_bytes,
        "steps": steps,
        "episodes": episodes,
        "bytes_per_transition": {"frames_once": round(ours, 1), "whole_rows": naive},
        "frames_per_transition": round(ours / frame_bytes, 3),
        "whole_rows_over_frames_once": round(naive / ours, 2),
        "sample_of_32_us": {"frames_once": round(sample_us(frames, samples), 1),
                            "whole_rows": round(sample_us(plain, samples), 1)},
    }  # fmt: skip
    if name.startswith("atari"):
        big = frame_replay(cfg, 1_000_000)
        big.extend(rows(big.index(_one_batch(cfg)), FRAME_KEYS))  # allocates the rows
        total = big.store.frames.nbytes + row_bytes(big.buffer) * 1_000_000
        out["one_million_transitions"] = {
            "frame_ring_bytes": big.store.frames.nbytes,
            "transition_rows_bytes": row_bytes(big.buffer) * 1_000_000,
            "total_gib": round(total / GIB, 2),
            "whole_rows_gib": round(naive * 1_000_000 / GIB, 2),
            "fits_8_gib": total <= 8 * GIB,
        }
    print(name, out, flush=True)
    return out


def _one_batch(cfg: EnvConfig):
    collector = Collector(
        make_env(cfg, seed=1), None, frames_per_batch=4, total_frames=4, storing_device="cpu"
    )
    batch = next(iter(collector)).clone()
    collector.shutdown()
    return batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {name: measure(name, cfg, args.steps, args.samples) for name, cfg in GAMES.items()}
    write("image_replay", {"games": results})


if __name__ == "__main__":
    main()
