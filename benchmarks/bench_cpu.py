"""Speed of each optimization callback on this CPU: ``python -m rl_lightning bench`` for the CPU experiments.

For each experiment it runs the real ``bench`` command (baseline without callbacks, each callback alone,
the ``fast`` preset; GPU-only callbacks are reported as n/a; method in ``rl_lightning/cli/bench/``) and
writes ``benchmarks/results/bench_cpu_<experiment>.json`` with the table and the machine it ran on. The run
itself (each variant's process log, ``bench_results.json``) lands in ``runs/<experiment>/`` and MLflow's
``mlflow.db`` of the working directory, as for any run.

Settings, and why: the default ``torch_threads=1`` (on a small, shared CPU, two OpenMP threads for small
MLPs wait on each other and make figures slow and erratic; see ``doctor``); 3 rounds over
all variants, each figure the best round's, which other processes' load lowers least; the JSON's
``baseline_spread`` says how much the baseline itself varied between rounds. TD-MPC2 (about 13 env
steps/s on this CPU) gets 2 rounds of 450 frames to stay within about 10 minutes. TD-MPC2 starts after 200
random frames (its seeding burst is as many updates), not the experiment's 1000: the burst is warm-up
either way and not part of the figures. The CPU-sized hockey experiment gets one round of the ``fast``
preset against none (about 5 minutes, 2 of them compiling).

Usage: python benchmarks/bench_cpu.py [--experiments dqn_cartpole tdmpc2_pendulum tdmpc2_hockey_cpu]
    [--repeats N] [-- extra hydra overrides for every bench, e.g. torch_threads=2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from _common import relative_paths

from rl_lightning.cli import experiments

RESULTS = Path(__file__).resolve().parent / "results"

#: Per-experiment overrides: a short run with a few hundred frames of steady state.
SETTINGS: dict[str, list[str]] = {
    "dqn_cartpole": ["bench.frames=3072", "bench.repeats=3"],
    "tdmpc2_pendulum": [
        "bench.frames=450",
        "collect.warmup_frames=200",
        "bench.act_calls=50",
        "bench.repeats=2",
    ],
    # The CPU-sized hockey experiment (4 envs per plan): only the preset a CPU user would switch on.
    "tdmpc2_hockey_cpu": [
        "bench.frames=600",
        "collect.warmup_frames=100",
        "bench.act_calls=10",
        "bench.repeats=1",
        "bench.variants=[fast]",
    ],
}


def stamp_command(path: Path, command: str) -> None:
    """Puts the command that reproduces ``path``'s figures at the top of the bench's JSON."""
    result = json.loads(path.read_text())
    result.pop("command", None)
    path.write_text(json.dumps(relative_paths({"command": command, **result}), indent=2) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiments", nargs="+", default=list(SETTINGS))
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default: per experiment)")
    parser.add_argument("extra", nargs="*", help="hydra overrides for every bench (after --)")
    args = parser.parse_args()
    known = experiments()
    failed = []
    for name in args.experiments:
        if name not in known:
            print(f"skipping {name}: no conf/experiment/{name}.yaml", flush=True)
            continue
        out = RESULTS / f"bench_cpu_{name}.json"
        command = [
            sys.executable,
            "-m",
            "rl_lightning",
            "bench",
            f"+experiment={name}",
            "device=cpu",
            f"bench.out={out}",
            *SETTINGS.get(name, []),
            *([f"bench.repeats={args.repeats}"] if args.repeats else []),
            *args.extra,
        ]
        print(" ".join(command[1:]), flush=True)
        start = time.perf_counter()
        if subprocess.run(command, check=False).returncode != 0:
            failed.append(name)
        elif out.exists():
            stamp_command(out, " ".join(["python benchmarks/bench_cpu.py", *sys.argv[1:]]))
        print(f"{name}: {time.perf_counter() - start:.0f} s -> {out}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
