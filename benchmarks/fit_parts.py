"""The data path's parts inside a whole ``fit``, timed with ``perf_counter`` instead of a profiler.

    python benchmarks/fit_parts.py [+experiment=sac_pendulum seed=0 total_frames=4000 ...] [--out DIR]

Runs ``python -m rl_lightning fit ARGS progress_bar=false`` in this process (with the default MLflow logger,
its store in a new directory under DIR) with a timer around each of: the collector's batches (acting and env
steps), the ingestion of each collection (``add_frames``: episode statistics, n-step, the replay write), the
replay samples of the update rounds, and each ``update``. A timer costs about a microsecond, so the parts keep
the cost they have in a plain run, including what each loses to the others in the CPU's caches (compare with
the same parts timed alone, for example ``benchmarks/results/replay_storage.json``). Writes
``benchmarks/results/fit_parts_<experiment>.json`` (or ``--json PATH``): the seconds, calls and microseconds
per call of each part, and per frame.

Two more parts are timed where they are called, so they stay measured when callbacks replace the module's
hot paths (compile, CUDA graphs: a replayed graph runs no Python, so the ``update`` timer, which wraps the
method itself, sees only the calls before capture): ``act``, the collector's call of the acting policy
(inside ``collection``), and ``training_step``, one item of the experience stream: its collections, their
``add_frames``, the replay samples and the updates (the updates' share is ``training_step`` minus the
other three).

``--ops`` also counts, per part and frame, the ATen operations that do work (views and other aliases left
out: on a GPU each of the others is a kernel launch or a copy, so outside a CUDA graph each costs host time)
and, among them, the host reads (``.item()``, ``nonzero``, ``masked_select``, ``unique``: on a GPU the host
waits for the device there, where the tensor is on the device; a CPU run cannot tell, so there they also
count the reads of tensors that stay on the host in a GPU run, such as a sampler's index: an upper bound).
It counts what runs eagerly; a replayed CUDA graph runs none and a compiled function shows its own calls,
so count with the default callbacks. Its dispatch mode slows every counted operation, so the times of an
``--ops`` run are not the run's; it writes ``fit_parts_<experiment>_ops.json``:

    python benchmarks/fit_parts.py +experiment=tdmpc2_hockey_cpu seed=0 total_frames=400 \
        collect.warmup_frames=200 logger=none --from-frames 240 --ops

On a GPU, ``--sync`` synchronises the device at the end of each timed part, so each part's time includes
its own device work (the run loses the overlap of host and device work it otherwise has), and
``--from-frames N`` counts only from the first collection that brings the run to ``N`` frames, leaving out
warm-up and compilation:

    python benchmarks/fit_parts.py +experiment=tdmpc2_hockey callbacks=fast device=cuda logger=none \
        total_frames=2500 collect.warmup_frames=300 --sync --from-frames 1500

``--before REV``: a change's before and after in one run. The tree at ``REV`` is checked out into a
temporary git worktree; each of ``--rounds`` rounds runs this script on ``OVERRIDES`` twice, once with the
worktree first on ``PYTHONPATH`` (its ``rl_lightning`` and ``callbacks``) and once with this tree first, the
order swapped every round, so both sides meet the same machine load. The harness is this tree's for both
(the parts it times must exist in ``REV``); the "after" side is this working tree as it is, uncommitted
changes included (the JSON says so). Writes ``benchmarks/results/revision_ab_<NAME>.json`` (``--name``,
default the experiment): every run's microseconds per frame of each part and its wall time, each side's
median per part, and the ratio after / before (below 1: the change made the part cheaper):

    python benchmarks/fit_parts.py --before 54c9e2c --rounds 2 --from-frames 3000 \
        --name rainbow_minatar_noisy_addcmul +experiment=rainbow_minatar ...
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from _common import ROOT, experiment_of, override_value, write

SECONDS: Counter[str] = Counter()
CALLS: Counter[str] = Counter()
DEPTH: Counter[str] = Counter()  # a method calling its parent's counts once
#: ``counting``: whether the timers add up yet (``--from-frames``); ``sync``: synchronise CUDA at each
#: part's end (``--sync``); ``first_frame``: the frame count when counting began; ``ops``: count operations
#: (``--ops``).
STATE: dict[str, Any] = {"counting": True, "sync": False, "first_frame": 0, "ops": False}
#: ``--ops``: per part, the operations that do work (``ops``) and the host reads among them; the parts a call
#: is inside of (a part inside another counts in both, as its time does).
OPS: dict[str, Counter[str]] = {}
ACTIVE: list[str] = []
#: Operations that return an alias although torch does not mark them as views.
_ALIASES = {"_unsafe_view"}
#: Operations whose result the host needs before it can go on (a device-to-host read on a GPU).
_HOST_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique", "_unique2",
               "unique_consecutive", "unique_dim", "is_nonzero", "equal"}  # fmt: skip


def _op_counter() -> Any:
    """A ``TorchDispatchMode`` that adds each working operation to the parts in ``ACTIVE``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if STATE["counting"] and not func.is_view and func.overloadpacket.__name__ not in _ALIASES:
                host_read = func.overloadpacket.__name__ in _HOST_READS
                for part in set(ACTIVE):
                    counts = OPS.setdefault(part, Counter())
                    counts["ops"] += 1
                    counts["host_reads"] += host_read
            return func(*args, **(kwargs or {}))

    return OpCounter()


class _Inside:
    """``ACTIVE`` holds ``part`` while inside; with ``--ops`` the outermost part turns the counter on."""

    def __init__(self, part: str) -> None:
        self.part, self.mode = part, None

    def __enter__(self) -> None:
        if STATE["ops"] and not ACTIVE:
            self.mode = _op_counter()
            self.mode.__enter__()
        ACTIVE.append(self.part)

    def __exit__(self, *exc: Any) -> None:
        ACTIVE.remove(self.part)
        if self.mode is not None:
            self.mode.__exit__(*exc)
            self.mode = None


def _end() -> float:
    """The time a part ends: after the device's queued work, with ``--sync`` on CUDA."""
    if STATE["sync"]:
        import torch

        if torch.cuda.is_initialized():
            torch.cuda.synchronize()
    return time.perf_counter()


def timed(owner: type, name: str, part: str) -> None:
    """Wraps ``owner.name`` with a timer counted under ``part``."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if DEPTH[part]:
            return function(*args, **kwargs)
        DEPTH[part] += 1
        counted = STATE["counting"]  # a call that began before counting did is left out whole
        start = time.perf_counter()
        try:
            with _Inside(part):
                return function(*args, **kwargs)
        finally:
            if counted:
                SECONDS[part] += _end() - start
                CALLS[part] += 1
            DEPTH[part] -= 1

    setattr(owner, name, wrapper)


def timed_items(owner: type, name: str, part: str) -> None:
    """Wraps the generator method ``owner.name``: each item it yields is timed under ``part``."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        items = function(*args, **kwargs)
        while True:
            counted = STATE["counting"]
            start = time.perf_counter()
            try:
                with _Inside(part):
                    item = next(items)
            except StopIteration:
                return
            finally:
                if counted:
                    SECONDS[part] += _end() - start
            if counted:
                CALLS[part] += 1
            yield item

    setattr(owner, name, wrapper)


def start_counting_at(owner: type, frames: int) -> None:
    """Turns the timers on after the frame budget's ``add`` that brings the run to ``frames`` frames."""
    function = owner.add

    @functools.wraps(function)
    def wrapper(self, *args, **kwargs):
        out = function(self, *args, **kwargs)
        if not STATE["counting"] and self.frames >= frames:
            STATE.update(counting=True, first_frame=self.frames)
        return out

    owner.add = wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "overrides", nargs="*", default=["+experiment=sac_pendulum", "seed=0", "total_frames=4000"]
    )
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_fit_parts")
    parser.add_argument("--sync", action="store_true", help="synchronise CUDA at the end of each part")
    parser.add_argument("--from-frames", type=int, default=0, help="count from this many frames on")
    parser.add_argument("--ops", action="store_true", help="count operations and host reads per part")
    parser.add_argument("--json", type=Path, help="write the figures here instead of benchmarks/results/")
    parser.add_argument("--before", help="the revision before a change: time both sides, alternating")
    parser.add_argument("--rounds", type=int, default=2, help="--before: rounds of both sides")
    parser.add_argument("--name", help="--before: the result's name (default: the experiment)")
    args = parser.parse_args()
    if args.before:
        before_and_after(args)
        return
    json_path = args.json.resolve() if args.json else None  # before the run's own directory is entered
    STATE.update(counting=args.from_frames <= 0, sync=args.sync, ops=args.ops)
    args.out.mkdir(parents=True, exist_ok=True)
    os.chdir(tempfile.mkdtemp(dir=args.out))  # a new run directory and MLflow store, as a first run has

    from torchrl.collectors import Collector

    import rl_lightning.cli as cli
    from rl_lightning.algos.base import RLModule
    from rl_lightning.data.budget import FrameBudget
    from rl_lightning.data.collection import Policy
    from rl_lightning.data.ingest import Ingestion
    from rl_lightning.data.stream import UpdateRound

    timed_items(Collector, "iterator", "collection")
    timed(Ingestion, "ingest", "add_frames")
    start_counting_at(FrameBudget, args.from_frames)
    timed(Policy, "__call__", "act")
    timed(RLModule, "training_step", "training_step")
    timed_items(UpdateRound, "_samples", "replay_sample")
    import rl_lightning.algos.ppo  # noqa: F401  (every algorithm's class; PPO's is not in the package's)

    classes = [RLModule]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        if "update" in vars(cls):
            timed(cls, "update", "update")
    start = time.perf_counter()
    code = cli.main(["fit", *args.overrides, "progress_bar=false"])
    wall = time.perf_counter() - start
    if code:
        sys.exit(code)
    frames = override_value(args.overrides, "total_frames")
    frames = None if frames is None else int(frames) - STATE["first_frame"]
    parts = {
        part: {
            "seconds": round(SECONDS[part], 3),
            "calls": CALLS[part],
            "us_per_call": round(1e6 * SECONDS[part] / max(CALLS[part], 1), 1),
            **({"us_per_frame": round(1e6 * SECONDS[part] / frames, 1)} if frames else {}),
            **(
                {
                    "ops_per_frame": round(OPS.get(part, Counter())["ops"] / frames, 1),
                    "host_reads_per_frame": round(OPS.get(part, Counter())["host_reads"] / frames, 2),
                }
                if args.ops and frames
                else {}
            ),
        }
        for part in PARTS
    }
    figures = {
        "overrides": args.overrides,
        "sync": args.sync,
        "ops": args.ops,
        "counted_from_frame": STATE["first_frame"],
        "wall_s": round(wall, 1),
        "parts": parts,
    }
    # An --ops run's times are the counter's, not the run's: its JSON has a name of its own.
    name = f"fit_parts_{experiment_of(args.overrides)}{'_ops' if args.ops else ''}"
    path = write(name, figures, json_path)
    for part, figures in parts.items():
        seconds, calls, per_call = figures["seconds"], figures["calls"], figures["us_per_call"]
        ops = f"  {figures['ops_per_frame']:9.1f} ops/frame" if "ops_per_frame" in figures else ""
        print(f"{part:14s} {seconds:8.2f} s  {calls:7d} calls  {per_call:9.1f} us{ops}")
    print(path)


PARTS = ("update", "collection", "act", "add_frames", "replay_sample", "training_step")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def run_side(tree: Path, overrides: list[str], extra: list[str], out: Path) -> dict:
    """One run of this script with ``tree``'s package first on the path; returns its figures."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
    }
    json_path = out / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *overrides, *extra, "--out", str(out),
         "--json", str(json_path)],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"fit_parts.py failed in {tree} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(json_path.read_text())


def before_and_after(args: argparse.Namespace) -> None:
    """``--before``: both sides, alternating, into ``revision_ab_<NAME>.json`` (the module docstring)."""
    before = git("rev-parse", "--short", args.before)
    extra = ["--from-frames", str(args.from_frames)] if args.from_frames else []
    work = Path(tempfile.mkdtemp(prefix="revision_ab_"))
    worktree = work / "before"
    git("worktree", "add", "--detach", str(worktree), before)
    try:
        trees = {"before": worktree, "after": ROOT}
        runs: dict[str, list[dict]] = {"before": [], "after": []}
        for i in range(args.rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                out = work / f"{side}_{i}"
                out.mkdir()
                figures = run_side(trees[side], args.overrides, extra, out)
                per_frame = {p: figures["parts"][p].get("us_per_frame") for p in PARTS}
                runs[side].append({"wall_s": figures["wall_s"], **per_frame})
                print(side, i, dict(runs[side][-1]), flush=True)
    finally:
        git("worktree", "remove", "--force", str(worktree))
    median = {
        side: {p: statistics.median(r[p] for r in rs) for p in (*PARTS, "wall_s") if rs[0][p] is not None}
        for side, rs in runs.items()
    }
    ratio = {p: round(median["after"][p] / median["before"][p], 3) for p in median["before"]}
    payload = {
        "before": before,
        "after": git("rev-parse", "--short", "HEAD")
        + (" with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""),
        "overrides": args.overrides,
        "from_frames": args.from_frames,
        "rounds": args.rounds,
        "us_per_frame": runs,
        "median_us_per_frame": median,
        "ratio_after_to_before": ratio,
    }
    print(json.dumps({"median_us_per_frame": median, "ratio_after_to_before": ratio}, indent=1))
    write(f"revision_ab_{args.name or experiment_of(args.overrides)}", payload)


if __name__ == "__main__":
    main()
