"""Learning benchmark over a table: experiments, frames, seeds, thresholds and the figures to compare with.

Each entry of a suite is one experiment with its overrides. Per seed it runs ``python -m rl_lightning fit``
through the real CLI in a work directory of its own (MLflow store included), reads back what the run logged
and evaluates a checkpoint (the last one, or ``best.ckpt``) on new episodes:

- ``train_last100``: the mean return of the last 100 training episodes before the budget (the exploring
  policy; the statistic of the MinAtar paper's curves, a 100-episode moving average);
- ``train_mean``: the mean return of all training episodes of the run (Dopamine's per-iteration figure:
  "Revisiting Rainbow" plots it per million frames);
- ``eval_curve`` (``eval/return_mean`` against frames: the run's own evaluations, on the **validation**
  episodes that also chose ``best.ckpt``), ``final_eval`` (the entry's checkpoint, greedy, over its
  ``final_episodes`` held-out **test** episodes, ``evaluate split=test``: the figure to report;
  ``final_evaluation`` holds every figure that evaluation printed where it printed more than the return:
  hockey's win/loss/draw per opponent), wall time and frames/s;
- with a ``threshold`` (validation figures, labelled so): ``first_reached_at_frames`` (the first evaluation
  at or above it within ``within`` frames), ``best_eval`` and ``last_eval`` (the best and the last
  evaluation within them), and with ``late_from`` how many of the evaluations from that frame on reach it;
  ``final_reaches_threshold`` is the test figure's;
- ``curves``: the history of each further metric the entry names; ``hooks``: evaluations of its own
  (``_learning_hooks.py``: option usage, hockey outcomes, trading against buy-and-hold).

Per entry the seeds are summarised with interval estimates (interquartile mean, mean, median, with 95%
stratified-bootstrap intervals from 5 seeds on; with fewer, the seeds' values) and set beside each
published figure of the same statistic: ``reached`` when the seeds' mean is at least the published value.
Every statistic carries the episodes it comes from (``splits``; docs/evaluation.md). A threshold's target
is ``needed`` seeds (all by default) reaching it: with a validation evaluation within the frames
(``target="reached"``), with the final test evaluation of the entry's checkpoint (``target="final"``) or of
the last checkpoint (``target="last"``).

    python benchmarks/learning.py SUITE [--only NAME ...] [--seeds 0 1 2] [--parallel 2] [--workdir DIR]
        [--final-episodes N] [--out NAME] [-- extra hydra overrides]

Each entry runs its own seeds unless ``--seeds`` names others. Results accumulate in
``benchmarks/results/<SUITE>.json`` (``--out``: ``<NAME>.json``; a seed already there is not run again unless
``--rerun``), so a suite can be run in parts, several at once: each seed is added to the file as it stands
when the seed finishes. A run cut short resumes from its last checkpoint when started again with the same
``--workdir``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from _common import RESULTS, cli, write
from _learning_hooks import HOOKS, RunRecord, history

from rl_lightning.training.mlflow_logger import live_history
from rl_lightning.training.stats import interval_estimates

LAST_EPISODES = 100


@dataclass(frozen=True)
class Published:
    """A figure from the literature (or another library) at the entry's frame count."""

    statistic: str  # train_last100 | train_mean | final_eval | best_eval | last_eval
    value: float
    source: str


@dataclass(frozen=True)
class Entry:
    """One experiment of a suite: what runs, on which seeds, and what its seeds are held to."""

    name: str
    experiment: str
    overrides: tuple[str, ...] = ()
    published: tuple[Published, ...] = field(default_factory=tuple)
    frames: int | None = None  # total_frames (None: the experiment's)
    seeds: tuple[int, ...] = (0, 1, 2)
    threshold: float | None = None  # an evaluation mean (eval/return_mean) to reach
    within: int | None = None  # ... within this many frames (None: the whole run)
    needed: int | None = None  # seeds that must reach it (None: all of them)
    target: str = "reached"  # what `needed` counts: reached (a validation evaluation within the frames) |
    # final (the test evaluation of `checkpoint`) | last (the last checkpoint's, with checkpoint="best")
    late_from: int | None = None  # also count the evaluations from this frame on that reach it
    checkpoint: str = "last"  # the checkpoint of the final evaluation: last | best
    final_episodes: int | None = None  # its test episodes (None: --final-episodes; 0: no final evaluation)
    curves: tuple[str, ...] = ()  # metrics whose history is kept beside eval/return_mean
    hooks: tuple[str, ...] = ()  # evaluations of its own (_learning_hooks.HOOKS)


_YOUNG_TIAN = (
    "Young and Tian 2019, MinAtar, Fig. 2 (kenjyoung/MinAtar README learning_curves.gif): DQN (full action "
    "set, centered RMSProp), 100-episode moving average of training returns at 1M frames, mean of 30 runs; "
    "read from the figure"
)
#: Hockey's evaluation figures against each scripted opponent.
HOCKEY_CURVES = tuple(
    f"eval/{o}/{r}" for o in ("weak", "strong") for r in ("win_rate", "loss_rate", "draw_rate", "return_mean")
)
_RATES = ("eval/win_rate", "eval/loss_rate", "eval/draw_rate")
_TRADING = {"final_episodes": 0, "curves": ("eval/validation/return_mean", "eval/test/return_mean"),
            "hooks": ("trading",)}  # fmt: skip
# Ten seeds where a seed costs under 10 minutes on two CPU cores, five otherwise (docs/evaluation.md).
_TEN = tuple(range(10))
_FIVE = (0, 1, 2, 3, 4)
# The final evaluations: 100 held-out test episodes of the entry's checkpoint (best.ckpt, chosen on the
# validation episodes, is shown with the last checkpoint beside it); the target counts them.
_TEST = {"final_episodes": 100, "target": "final"}
_CARTPOLE = {"threshold": 475.0, "within": 50_000, "checkpoint": "best", "seeds": _TEN, **_TEST}
_PENDULUM = {"threshold": -200.0, "within": 20_000, "seeds": _TEN, **_TEST}
# DQN's final policy: which setting makes the last checkpoint hold on CartPole (its greedy policy a Polyak
# average of the online network, the recipe; none; a larger final epsilon), counted on the last checkpoint.
_DQN_LAST = {"seeds": _TEN, "threshold": 475.0, "within": 50_000, "checkpoint": "best",
             "final_episodes": 100, "target": "last", "late_from": 25_000}  # fmt: skip

SUITES: dict[str, list[Entry]] = {
    # MinAtar at 1M frames, 5 seeds: the presets (minimal action sets, Adam), compared with nothing they do
    # not match, and the MinAtar paper's protocol (full action set, RMSProp) beside the paper's curves.
    # Revisiting Rainbow's figures are not set beside ours: its runs play the full action set.
    "minatar": [
        *(Entry(f"{algo}_minimal_{key}", f"{algo}_minatar", (f"env.id=MinAtar/{game}-v1",), seeds=_FIVE)
          for algo in ("dqn", "rainbow")
          for key, game in (("breakout", "Breakout"), ("space_invaders", "SpaceInvaders"))),
        Entry("dqn_paper_breakout", "dqn_minatar_paper", ("env.id=MinAtar/Breakout-v0",),
              (Published("train_last100", 9.2, _YOUNG_TIAN),), seeds=_FIVE),
        Entry("dqn_paper_space_invaders", "dqn_minatar_paper", ("env.id=MinAtar/SpaceInvaders-v0",),
              (Published("train_last100", 32.8, _YOUNG_TIAN),), seeds=_FIVE),
    ],
    "control": [
        Entry("dqn_cartpole", "dqn_cartpole", ("eval.every_frames=2500",), **_DQN_LAST),
        Entry("dqn_cartpole_no_average", "dqn_cartpole", ("eval.every_frames=2500", "algo.eval_polyak=null"),
              **_DQN_LAST),
        Entry("dqn_cartpole_eps_end_0.1", "dqn_cartpole",
              ("eval.every_frames=2500", "algo.eval_polyak=null", "algo.eps_end=0.1"), **_DQN_LAST),
        Entry("qrdqn_cartpole", "qrdqn_cartpole", ("eval.every_frames=2500",), **_CARTPOLE),
        Entry("rainbow_cartpole", "rainbow_cartpole", ("eval.every_frames=2500",), **_CARTPOLE),
        Entry("iqn_cartpole", "iqn_cartpole", ("eval.every_frames=2500",), **_CARTPOLE),
        Entry("sac_pendulum", "sac_pendulum", **_PENDULUM),
        Entry("td3_pendulum", "td3_pendulum", **_PENDULUM),
        Entry("ddpg_pendulum", "ddpg_pendulum", **_PENDULUM),
        Entry("aciqn_pendulum", "aciqn_pendulum", ("eval.every_frames=2000",), checkpoint="best",
              **{**_PENDULUM, "seeds": _FIVE}),
        Entry("sac_options_pendulum", "sac_options_pendulum", threshold=-250.0, within=30_000, seeds=_FIVE,
              hooks=("options",), **_TEST),
        Entry("sac_discrete_cartpole", "sac_discrete_cartpole", threshold=475.0, within=100_000, seeds=_FIVE,
              **_TEST),
        # 5k frames, as the committed figure ran (the criterion: -200 within the recipe's 15k); no final
        # evaluation (100 planned episodes take longer than the run): validation figures alone.
        Entry("tdmpc2_pendulum", "tdmpc2_pendulum", frames=5_000, threshold=-200.0, within=15_000,
              seeds=_FIVE, final_episodes=0, curves=("train/episode_return",)),
    ],
    # Laser hockey against the scripted opponents: win, loss and draw rates of the final checkpoints.
    "hockey": [
        # SAC with options next to flat SAC, both cut to a CPU-sized 50k frames (their recipes: 200k).
        *(Entry(f"{name}_50k", name, ("eval.every_frames=10000", "checkpoint.every_frames=10000"),
                frames=50_000, seeds=_FIVE, curves=HOCKEY_CURVES, hooks=hooks)
          for name, hooks in (("sac_options_hockey", ("hockey", "options")), ("sac_hockey", ("hockey",)))),
        # Discrete IQN vs the weak opponent acting risk-neutral and on CVaR(0.25).
        Entry("iqn_hockey_neutral", "iqn_hockey_discrete", frames=150_000, seeds=_FIVE, curves=_RATES,
              hooks=("hockey",)),
        Entry("iqn_hockey_cvar", "iqn_hockey_discrete", ("algo.risk=cvar", "algo.risk_param=0.25"),
              frames=150_000, seeds=_FIVE, curves=_RATES, hooks=("hockey",)),
        # TD-MPC2 on a CPU, one seed (1.7 hours on two cores): its own evaluations, 10 games per opponent.
        Entry("tdmpc2_hockey_cpu", "tdmpc2_hockey_cpu", frames=100_000, seeds=(0,), final_episodes=0,
              curves=(*HOCKEY_CURVES, "train/episode_return")),
        # The agent that wins (benchmarks/agents/hockey_sac.ckpt came from this recipe): 200 test games
        # against each opponent, against the goals.
        Entry("sac_hockey_curriculum", "sac_hockey_curriculum", seeds=(0,), final_episodes=200,
              curves=(*HOCKEY_CURVES, "eval/win_rate", "curriculum/stage"), hooks=("hockey_goals",)),
        # TD-MPC2 through the same curriculum, collecting with its policy prior: the same 200-game goals.
        Entry("tdmpc2_hockey_curriculum", "tdmpc2_hockey_curriculum", seeds=(0,), final_episodes=200,
              curves=(*HOCKEY_CURVES, "eval/win_rate", "curriculum/stage"), hooks=("tdmpc2_hockey_goals",)),
    ],
    # PPO, the on-policy family: CartPole with the RL zoo's recipe, held to 475 within its 100k frames on the
    # final policy's 100 test episodes, ten seeds.
    "ppo": [
        Entry("ppo_cartpole", "ppo_cartpole", ("eval.every_frames=5000",), threshold=475.0, within=100_000,
              seeds=_TEN, **_TEST),
        # LunarLander: 200 within 1M frames (the zoo's recipe), five seeds.
        Entry("ppo_lunarlander", "ppo_lunarlander", threshold=200.0, within=1_000_000, seeds=_FIVE, **_TEST),
        # The same recipe on the continuous engines: a Gaussian policy, the same goal.
        Entry("ppo_lunarlander_continuous", "ppo_lunarlander_continuous", threshold=200.0, within=1_000_000,
              seeds=_FIVE, **_TEST),
        # MinAtar at 1M frames, five seeds, the minimal action sets as the DQN presets play them.
        *(Entry(f"ppo_minatar_{key}", "ppo_minatar", (f"env.id=MinAtar/{game}-v1",), seeds=_FIVE)
          for key, game in (("breakout", "Breakout"), ("space_invaders", "SpaceInvaders"))),
    ],
    # SAC with options on GOOGL, and on the NASDAQ Composite (a series no choice of the recipe looked at), 5
    # seeds each; EUR/USD hourly (1 bp: about the pair's spread). The held-out period against buy-and-hold,
    # a moving-average crossover and a constant position at each policy's mean exposure.
    "trading": [
        Entry("sac_options_trading", "sac_options_trading", seeds=_FIVE, **_TRADING),
        Entry("sac_options_trading_nasdaq", "sac_options_trading", ("+env.kwargs.dataset=INDEX_NASDAQ",),
              seeds=_FIVE, **_TRADING),
        Entry("sac_options_trading_eurusd", "sac_options_trading",
              ("env.id=TradingForex-v0", "env.kwargs.transaction_cost=0.0001"), seeds=_FIVE, **_TRADING),
    ],
}  # fmt: skip


def episode_returns(client: Any, run_id: str) -> list[tuple[int, int, float]]:
    """``(frame, episodes, mean return)`` per logging interval of a run, from ``train/episodes`` (the running
    count) and ``train/episode_return`` (the mean over the interval's episodes, logged where there were
    some). A resumed run's intervals are those of the run as it stands (``live_history``). A count that
    grew with no return logged beside it is left out: the episodes ended before the checkpoint a run was
    resumed from, which (before checkpoints held the episodes not yet logged) kept their count but not their
    returns."""
    counts = live_history(client.get_metric_history(run_id, "train/episodes"))
    means = live_history(client.get_metric_history(run_id, "train/episode_return"))
    out, seen, j = [], 0, 0
    for m in counts:
        new = int(m.value) - seen
        seen = int(m.value)
        if new <= 0:
            continue
        while j < len(means) and means[j].step < m.step:
            j += 1
        if j == len(means) or means[j].step != m.step:
            continue
        out.append((int(m.step), new, float(means[j].value)))
        j += 1
    return out


def training_statistics(intervals: list[tuple[int, int, float]]) -> dict[str, float]:
    """``train_mean`` over all intervals and ``train_last100`` over the last intervals holding at least
    :data:`LAST_EPISODES` episodes (the trailing moving average at the end of the run); nothing for a run
    that finished no episode."""
    if not intervals:
        return {}
    counts = np.array([n for _, n, _ in intervals], dtype=float)
    sums = np.array([n * r for _, n, r in intervals])
    tail = np.cumsum(counts[::-1])
    k = int(np.searchsorted(tail, LAST_EPISODES)) + 1  # intervals from the end covering 100 episodes
    return {
        "train_mean": float(sums.sum() / counts.sum()),
        "train_last100": float(sums[-k:].sum() / counts[-k:].sum()),
        "train_episodes": int(counts.sum()),
    }


def threshold_statistics(entry: Entry, curve: list[list[float]], final: float | None) -> dict[str, Any]:
    """The first evaluation at the threshold within ``entry.within`` frames, the best and the last within
    them, the late evaluations reaching it and whether the final evaluation does."""
    within = [(f, v) for f, v in curve if entry.within is None or f <= entry.within]
    first = next((f for f, v in within if v >= entry.threshold), None)
    out: dict[str, Any] = {
        "first_reached_at_frames": first,
        "best_eval": max(v for _, v in within),
        "last_eval": within[-1][1],
    }
    if entry.late_from is not None:
        late = [v for f, v in curve if f >= entry.late_from]
        out["late_evals_reaching"] = [sum(v >= entry.threshold for v in late), len(late)]
    if final is not None:
        out["final_reaches_threshold"] = final >= entry.threshold
    return out


def evaluate(workdir: Path, log: Path, ckpt: str, episodes: int, *extra: str) -> dict[str, float]:
    """``python -m rl_lightning evaluate`` of ``ckpt`` over ``episodes`` episodes: its printed figures."""
    return json.loads(cli(workdir, log, "evaluate", f"ckpt={ckpt}", f"episodes={episodes}", "logger=none",
                          *extra))  # fmt: skip


def run_seed(entry: Entry, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import mlflow

    workdir = args.workdir / entry.name / f"seed{seed}"
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "log.txt"
    frames = [f"total_frames={entry.frames}"] if entry.frames is not None else []
    overrides = [f"+experiment={entry.experiment}", *entry.overrides, *frames, f"seed={seed}",
                 "progress_bar=false", *args.extra]  # fmt: skip
    resumed = any(workdir.glob("runs/*/*/checkpoints/last.ckpt"))
    if resumed:
        overrides.append("ckpt_path=last")  # a run cut short goes on from its last checkpoint
    start = time.perf_counter()
    summary = json.loads(cli(workdir, log, "fit", *overrides))
    wall = time.perf_counter() - start
    client = mlflow.MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    run_id = (workdir / summary["run_dir"] / "mlflow_run_id").read_text().strip()
    curve = history(client, run_id, "eval/return_mean")
    episodes = args.final_episodes if entry.final_episodes is None else entry.final_episodes
    final = None
    if episodes:
        ckpt = summary.get(f"{entry.checkpoint}_ckpt")
        if ckpt is None:
            raise RuntimeError(f"{entry.name} seed {seed}: no {entry.checkpoint}.ckpt was written; see {log}")
        final = evaluate(workdir, log, ckpt, episodes, "split=test")
        if entry.checkpoint == "best":  # the policy the run ended with, on the same test episodes
            last = evaluate(workdir, log, summary["last_ckpt"], episodes, "split=test")
    record: dict[str, Any] = {
        "seed": seed,
        "frames": summary["frames"],
        "updates": summary["updates"],
        # A resumed run's wall time covers only its last part, so it gives no rate.
        "resumed": resumed,
        "wall_s": None if resumed else round(wall, 1),
        "frames_per_s": None if resumed else round(summary["frames"] / wall, 1),
        **training_statistics(episode_returns(client, run_id)),
    }
    if final is not None:
        record.update(final_eval=final["return_mean"], final_eval_episodes=episodes, final_eval_split="test")
        if entry.checkpoint != "last":
            record.update(final_eval_checkpoint=entry.checkpoint, final_eval_last=last["return_mean"])
        if set(final) - {"return_mean", "return_std", "length_mean"}:
            record["final_evaluation"] = final
    if entry.threshold is not None:
        record.update(threshold_statistics(entry, curve, record.get("final_eval")))
    record["eval_curve"] = curve
    if entry.curves:
        record["curves"] = {key: history(client, run_id, key) for key in entry.curves}
    run = RunRecord(workdir, summary, client, run_id, final)
    for hook in entry.hooks:
        record.update(HOOKS[hook].per_seed(run))
    return record


#: The episodes each statistic comes from (docs/evaluation.md): training episodes (the exploring policy),
#: validation (the in-training evaluations, which chose best.ckpt) or test (held-out).
SPLITS = {"train_last100": "training", "train_mean": "training", "best_eval": "validation",
          "last_eval": "validation", "final_eval": "test", "final_eval_last": "test"}  # fmt: skip


def threshold_summary(entry: Entry, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """How many seeds reached the threshold (with an in-training evaluation within the frames, on the
    validation episodes, and with the final evaluation, on the test episodes) and whether the entry's target
    is met."""
    first = [r["first_reached_at_frames"] for r in runs]
    out: dict[str, Any] = {
        "value": entry.threshold,
        "within_frames": entry.within,
        "first_reached_at_frames": first,
        "seeds_reaching": sum(f is not None for f in first),
        "seeds_reaching_split": "validation",
    }
    if all("final_reaches_threshold" in r for r in runs):
        out["finals_reaching"] = sum(r["final_reaches_threshold"] for r in runs)
        out["finals_reaching_split"] = "test"
    if all("final_eval_last" in r for r in runs):
        out["last_checkpoints_reaching"] = sum(r["final_eval_last"] >= entry.threshold for r in runs)
    if entry.late_from is not None:
        late = np.array([r["late_evals_reaching"] for r in runs]).sum(0)
        out["late_evals_reaching"] = f"{late[0]}/{late[1]} from {entry.late_from} frames"
    counts = {"reached": out["seeds_reaching"], "final": out.get("finals_reaching", 0),
              "last": out.get("last_checkpoints_reaching", 0)}  # fmt: skip
    count = counts[entry.target]
    out["needed"] = entry.needed if entry.needed is not None else len(runs)
    out["counted_by"] = {
        "reached": "an in-training evaluation within the frames (validation episodes)",
        "final": f"the final evaluation of the {entry.checkpoint} checkpoint (test episodes)",
        "last": "the final evaluation of the last checkpoint (test episodes)",
    }[entry.target]
    out["target_met"] = count >= out["needed"]
    return out


def summarise(entry: Entry, seeds: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Interval estimates per statistic over the seeds, the threshold's target, each published figure beside
    ours, and what the entry's hooks sum up."""
    runs = list(seeds.values())
    stats = [s for s in SPLITS if all(r.get(s) is not None for r in runs)]
    out: dict[str, Any] = {"seeds": len(runs), "splits": {s: SPLITS[s] for s in stats}}
    for stat in stats:
        out[stat] = interval_estimates(np.array([[r[stat]] for r in runs]))
    if entry.threshold is not None:
        out["threshold"] = threshold_summary(entry, runs)
    out["published"] = [
        {
            "statistic": p.statistic,
            "value": p.value,
            "source": p.source,
            "ours_mean": out[p.statistic]["mean"]["value"],
            "reached": out[p.statistic]["mean"]["value"] >= p.value,
        }
        for p in entry.published
        if p.statistic in out
    ]
    for hook in entry.hooks:
        out.update(HOOKS[hook].summary(runs))
    return out


def brief(outcome: dict[str, Any]) -> str:
    """A seed's headline figures, for the console."""
    keys = ("train_last100", "train_mean", "first_reached_at_frames", "last_eval", "final_eval")
    shown = {k: outcome[k] for k in keys if k in outcome}
    return ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items())


def _entries(path: Path) -> dict[str, Any]:
    """The entries a results file holds (none when it is missing or still empty)."""
    text = path.read_text() if path.is_file() else ""
    return json.loads(text).get("entries", {}) if text.strip() else {}


def reproduce(args: argparse.Namespace, results: dict[str, Any]) -> str:
    """The command that runs every entry the results file holds: the file accumulates over several runs,
    each with its own ``command``."""
    parts = ["python benchmarks/learning.py", args.suite]
    if set(results) != {e.name for e in SUITES[args.suite]}:
        parts += ["--only", *[e.name for e in SUITES[args.suite] if e.name in results]]
    if args.out:
        parts += ["--out", args.out]
    return " ".join(parts)


def _frames(n: float) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.3g}M"
    return f"{n / 1000:.3g}k"


def _estimate(est: dict[str, dict[str, Any]], values: list[float]) -> str:
    """The IQM with its 95% interval, or with fewer than 5 seeds the seeds' values (no interval)."""
    iqm = est["iqm"]
    if iqm["low"] is None:
        return "per seed: " + ", ".join(f"{v:.0f}" for v in values)
    return f"{iqm['value']:.0f} [{iqm['low']:.0f}, {iqm['high']:.0f}]"


def markdown_table(results: dict[str, Any], entries: list[str] | None = None) -> str:
    """The learning claims of a suite's results as a markdown table, one row per entry with a threshold
    (``entries``: those, in that order): the test figures first (how many seeds' final policies reach the
    threshold on held-out episodes and their interquartile mean with its 95% stratified-bootstrap interval;
    an entry that chose ``best.ckpt`` also shows the last checkpoint), then what the in-training evaluations
    on the validation episodes saw. The README's and the docs' tables are this text (``docs/gen_tables.py``,
    checked by a test)."""
    rows = [
        "| entry | goal | test: seeds reaching it | test: final evaluation, IQM [95% CI] "
        "| validation: seeds reaching it in training | validation: first reached at (median) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    names = entries if entries is not None else list(results["entries"])
    for name in names:
        data = results["entries"][name]
        summary = data["summary"]
        if "threshold" not in summary:
            continue
        thr, runs = summary["threshold"], list(data["seeds"].values())
        first = [f for f in thr["first_reached_at_frames"] if f is not None]
        when = _frames(float(np.median(first))) if first else "–"
        final = reaching = "–"
        if "final_eval" in summary:
            ckpt, episodes = runs[0].get("final_eval_checkpoint", "last"), runs[0]["final_eval_episodes"]
            values = [r["final_eval"] for r in runs]
            final = f"{_estimate(summary['final_eval'], values)} ({ckpt} checkpoint, {episodes} episodes)"
            reaching = f"{thr['finals_reaching']} of {summary['seeds']}"
            if "final_eval_last" in summary:
                last = [r["final_eval_last"] for r in runs]
                final += f"; last checkpoint: {_estimate(summary['final_eval_last'], last)}"
                reaching += f" (last checkpoint: {thr['last_checkpoints_reaching']})"
        rows.append(
            f"| `{name}` | {thr['value']:g} within {_frames(thr['within_frames'])} frames "
            f"| {reaching} | {final} | {thr['seeds_reaching']} of {summary['seeds']} | {when} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=sorted(SUITES))
    parser.add_argument("--only", nargs="+", help="entries of the suite to run (default: all)")
    parser.add_argument("--seeds", type=int, nargs="+", help="seeds for every entry (default: each entry's)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at once (one per core)")
    parser.add_argument("--final-episodes", type=int, default=100, help="where the entry says none")
    parser.add_argument("--rerun", action="store_true", help="run seeds already in the results again")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "rl_lightning_learning")
    parser.add_argument("--out", help="results file name (default: the suite's)")
    parser.add_argument("--table", action="store_true", help="print the results' markdown table and stop")
    parser.add_argument("extra", nargs="*", help="hydra overrides for every run (after --)")
    args = parser.parse_intermixed_args()
    names = {e.name for e in SUITES[args.suite]}
    unknown = sorted(set(args.only or ()) - names)
    if unknown:
        parser.exit(2, f"learning: no entry {unknown} in suite {args.suite}; choose from {sorted(names)}.\n")
    name = args.out or args.suite
    path = RESULTS / f"{name}.json"
    if args.table:
        print(markdown_table(json.loads(path.read_text())))
        return
    previous = _entries(path)
    entries = [e for e in SUITES[args.suite] if not args.only or e.name in args.only]
    seeds = {e.name: args.seeds or list(e.seeds) for e in entries}
    jobs = [  # seed by seed: a suite cut short has every entry on its first seeds
        (e, seeds[e.name][i]) for i in range(max(map(len, seeds.values()))) for e in entries
        if i < len(seeds[e.name])
        and (args.rerun or str(seeds[e.name][i]) not in previous.get(e.name, {}).get("seeds", {}))
    ]  # fmt: skip
    lock = threading.Lock()

    def record(job: tuple[Entry, int]) -> None:
        entry, seed = job
        outcome = run_seed(entry, seed, args)
        # Threads of this process and other processes writing the same file (other entries or seeds run
        # at the same time) take turns, and each adds its seed to what the file holds by then.
        with lock, path.open("a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            results = _entries(path)
            data = results.setdefault(entry.name, {"seeds": {}})
            data.update({"experiment": entry.experiment, "overrides": [*entry.overrides, *args.extra]})
            # The entry's own command, with the overrides this run added (the file's ``reproduce`` has none).
            data["reproduce"] = " ".join(["python benchmarks/learning.py", args.suite, "--only", entry.name,
                                          *args.extra])  # fmt: skip
            if entry.frames is not None:
                data["frames"] = entry.frames
            data["seeds"] = {**data.get("seeds", {}), str(seed): outcome}
            data["summary"] = summarise(entry, data["seeds"])
            payload = {"reproduce": reproduce(args, results), "suite": args.suite, "entries": results}
            write(name, payload, path)
        print(f"{entry.name} seed {seed}: {brief(outcome)}", flush=True)

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(record, jobs))


if __name__ == "__main__":
    main()
