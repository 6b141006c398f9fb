"""A change's before and after in one run: whole fits of two revisions, alternating, each timed by parts.

    python benchmarks/revision_ab.py --before REV [--rounds 2] [--name NAME] -- OVERRIDES... [--from-frames N]

The tree at ``REV`` is checked out into a temporary git worktree. Each round runs this tree's
``benchmarks/fit_parts.py`` on ``OVERRIDES`` twice: once with the worktree first on ``PYTHONPATH`` (its
``rl_lightning`` and ``callbacks``), once with this tree first, the order swapped every round, so that both
sides meet the same machine load. The harness is the same for both (the parts it times must exist in
``REV``). The "after" side is this working tree as it is, uncommitted changes included (the JSON says so).

Writes ``benchmarks/results/revision_ab_<NAME>.json`` (``NAME`` defaults to the experiment): every run's
microseconds per frame of each part and its wall time, each side's median per part, and the ratio after /
before (below 1: the change made the part cheaper).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import ROOT, experiment_of, write

PARTS = ("update", "collection", "act", "add_frames", "replay_sample", "training_step")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def fit_parts(tree: Path, overrides: list[str], extra: list[str], out: Path) -> dict:
    """One ``fit_parts.py`` run with ``tree``'s package first on the path; returns its figures."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])),
    }
    json_path = out / "figures.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fit_parts.py"), *overrides, *extra, "--out", str(out),
         "--json", str(json_path)],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        sys.exit(f"fit_parts.py failed in {tree} (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return json.loads(json_path.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the revision before the change")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", help="the result's name (default: the experiment)")
    parser.add_argument("--from-frames", type=int, default=0, help="fit_parts.py's --from-frames")
    parser.add_argument("overrides", nargs="+", help="the fit's overrides")
    args = parser.parse_args()
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
                figures = fit_parts(trees[side], args.overrides, extra, out)
                runs[side].append(
                    {
                        "wall_s": figures["wall_s"],
                        **{p: figures["parts"][p].get("us_per_frame") for p in PARTS},
                    }
                )
                print(side, i, {k: v for k, v in runs[side][-1].items()}, flush=True)
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
