"""Ctrl-C at random moments: every interrupted `fit` exits cleanly with a checkpoint that resumes.

Each try starts ``python -m rl_lightning fit +experiment=dqn_cartpole`` (short collections, frequent
evaluations and checkpoints, so a random moment falls in any phase: start-up, warm-up, collection, update,
evaluation, checkpoint writing), sends SIGINT after a random delay (one try in ten during start-up, the
others after the run is built), and checks: exit code 130, no traceback, and, when training had started, a
``last.ckpt`` that loads safely and from which ``ckpt_path=last`` trains 128 more frames.

    python benchmarks/ctrl_c_stress.py [--tries 20] [--seed 0] [--workdir /tmp/ctrl_c_stress]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from _common import write

FIT = [
    "+experiment=dqn_cartpole",
    "device=cpu",
    "logger=none",
    "progress_bar=false",
    "collect.frames_per_batch=64",
    "collect.warmup_frames=128",
    "eval.every_frames=512",
    "eval.episodes=3",
    "checkpoint.every_frames=256",
]


def _ctrl_c_as_in_a_terminal() -> None:
    # A script started in the background ignores SIGINT, and children inherit that: undo it, so that the
    # run meets SIGINT as it does when started from a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(cwd: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "rl_lightning", "fit", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )  # fmt: skip


def one_try(workdir: Path, delay: float, during_startup: bool) -> dict:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    proc = cli(workdir, *FIT, "total_frames=200000")
    if not during_startup:
        proc.stdout.readline()  # "fit dqn_cartpole: ...": the run is built, training starts
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    result = {
        "after": "start" if during_startup else "fit started",
        "delay_s": round(delay, 2),
        "exit_code": proc.returncode,
        "traceback": "Traceback" in err,
    }
    lasts = list(workdir.glob("runs/dqn_cartpole/*/checkpoints/last.ckpt"))
    result["checkpoint"] = bool(lasts)
    if lasts:
        from rl_lightning.training.safe_load import load_checkpoint

        state = next(v for k, v in load_checkpoint(lasts[0]).items() if k.endswith("RLDataModule"))
        result["frames_at_stop"] = int(state["frames"])
        resume = cli(workdir, *FIT, f"total_frames={state['frames'] + 128}", "ckpt_path=last")
        r_out, _ = resume.communicate(timeout=300)
        frames = json.loads(r_out.strip().splitlines()[-1])["frames"] if resume.returncode == 0 else None
        result["resumed"] = resume.returncode == 0 and frames == state["frames"] + 128
    else:
        # Interrupted before training started (imports, building the run): nothing to resume, nothing lost.
        result["resumed"] = None
        result["stopped_before_training"] = "frames/s" not in out
    # Before training starts (imports, building the run) there is nothing to save.
    early = result["resumed"] is None and result["stopped_before_training"]
    clean = result["exit_code"] == 130 and not result["traceback"]
    result["ok"] = clean and (result["resumed"] is True or early)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=10.0, help="seconds after training started")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/rl_lightning_ctrl_c"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    tries = []
    for i in range(args.tries):
        # One try in ten lands in the start-up (imports, building the run); the others during training.
        startup = i % 10 == 0
        delay = rng.uniform(0.2, 3.0) if startup else rng.uniform(0.0, args.max_delay)
        result = one_try(args.workdir / f"try{i}", delay, startup)
        tries.append(result)
        print(json.dumps(result), flush=True)
    ok = sum(t["ok"] for t in tries)
    print(write("ctrl_c_stress", {"tries": tries, "ok": ok, "of": len(tries), "fit_overrides": FIT}))
    sys.exit(0 if ok == len(tries) else 1)


if __name__ == "__main__":
    main()
