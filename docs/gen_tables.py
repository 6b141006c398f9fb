"""Renders every table of figures in README.md and docs/ from the results JSON it reports.

A rendered table sits between two markers; the first names its renderer and the renderer's arguments:

    <!-- table: learning control dqn_cartpole qrdqn_cartpole -->
    | ... the rendered rows ... |
    <!-- /table -->

    python docs/gen_tables.py           # render every table in place
    python docs/gen_tables.py --check   # print each table that differs from its results and exit 1

``tests/test_docs.py`` runs the check, so a table typed by hand, or left behind by a new result, fails the
suite. Under each table the page names its JSON and the command that reproduces it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: The pages whose tables are rendered.
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = re.compile(r"<!-- table: (?P<spec>[^>]*?) -->\n(?P<body>.*?)<!-- /table -->", re.S)


def _benchmark(name: str) -> Any:
    """``benchmarks/<name>.py`` (the learning runner's table code is the one the suites' results use)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def _result(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / f"{name}.json").read_text())


def readme(*heading: str) -> str:
    """A section of README.md as the docs show it: the text under ``## <heading>`` (no words: the text
    before the first section), its links into ``docs/`` made relative to the docs."""
    text = (ROOT / "README.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)
    if heading:
        title = " ".join(heading)
        body = next(s for s in sections[1:] if s.splitlines()[0].strip() == title).split("\n", 1)[1]
        body = f"## {title}\n{body}"
    else:
        body = sections[0].split("\n", 1)[1]  # after the title line
    body = re.sub(r"\]\(docs/", "](", body)
    return body.strip()


def learning(suite: str, *entries: str) -> str:
    """The learning table of a suite's results (``benchmarks/learning.py``'s ``markdown_table``): its
    threshold entries, or the ``entries`` named, in that order; those not run yet are left out."""
    results = _result(suite)
    names = [e for e in entries if e in results["entries"]] if entries else None
    return _benchmark("learning").markdown_table(results, names)


def learning_seeds(suite: str, *entries: str) -> str:
    """Per seed of each entry (``entries``, or every entry of the suite): the mean return of the last 100
    and of all training episodes, the final evaluation with the episodes it played (test, or the validation
    episodes of a run from before the evaluation protocol), and each published figure of the entry."""
    results = _result(suite)["entries"]
    rows = [
        "| entry | seed | last 100 training episodes | all training episodes | final evaluation "
        "| published |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name in entries or results:
        if name not in results:
            continue
        data = results[name]
        figures = data["summary"].get("published", [])
        published = "; ".join(f"{p['value']:g} ({p['statistic']})" for p in figures)
        for i, (seed, run) in enumerate(sorted(data["seeds"].items(), key=lambda kv: int(kv[0]))):
            final = "–"
            if "final_eval" in run:
                where = "test" if run.get("final_eval_split") == "test" else "validation episodes"
                ckpt = run.get("final_eval_checkpoint", "last")
                final = f"{run['final_eval']:.2f} ({ckpt} checkpoint, {run['final_eval_episodes']} {where})"
            rows.append(
                f"| `{name}` | {seed} | {run.get('train_last100', float('nan')):.2f} "
                f"| {run.get('train_mean', float('nan')):.2f} | {final} | {published if i == 0 else ''} |"
            )
    return "\n".join(rows)


def iqn_hockey_risk(name: str) -> str:
    """Risk-neutral against CVaR acting at discrete hockey (``iqn_hockey_risk.json``): each seed's final
    checkpoint's win / loss / draw rates over its games and the means over the seeds."""
    data = _result(name)
    rows = ["| acting | per seed W/L/D | mean W/L/D | mean return |", "| --- | --- | --- | --- |"]
    for risk, summary in data["summary"].items():
        runs = sorted((r for r in data["runs"] if r["risk"] == risk), key=lambda r: r["seed"])
        rates = ("win_rate", "loss_rate", "draw_rate")
        seeds = ", ".join(
            f"{r['seed']}: " + "/".join(f"{r['final_100_games'][k]:.2f}" for k in rates) for r in runs
        )
        mean = "/".join(f"{summary[k]:.2f}" for k in rates)
        rows.append(f"| {risk} | {seeds} | {mean} | {summary['return_mean']:.1f} |")
    return "\n".join(rows)


def options_hockey(name: str) -> str:
    """SAC with options against flat SAC at hockey (``sac_options_hockey.json``): the last checkpoints'
    win / loss / draw rates per opponent, means over the seeds, and the wall time per run."""
    data = _result(name)
    rows = [
        "| | vs weak: win / loss / draw | vs strong: win / loss / draw | wall time per run |",
        "| --- | --- | --- | --- |",
    ]
    for experiment, per_opponent in data["mean_last_ckpt"].items():
        cells = [
            " / ".join(_percent(per_opponent[o][f"{r}_rate"]) for r in ("win", "loss", "draw"))
            for o in ("weak", "strong")
        ]
        rows.append(f"| `{experiment}` | {cells[0]} | {cells[1]} | {data['wall_s_mean'][experiment]:.0f} s |")
    return "\n".join(rows)


def hockey_seed(suite: str, entry: str, seed: str = "0") -> str:
    """One seed's final hockey evaluations (a learning suite's entry): win / loss / draw per opponent, with
    the run's own eval seed and each further eval seed it was played on (entries from before the evaluation
    protocol)."""
    run = _result(suite)["entries"][entry]["seeds"][seed]
    games = {f"the run's evaluation seed, {run['final_eval_episodes']} each": run["final_evaluation"]}
    games.update(
        {f"eval seed {s}": stats for s, stats in run.get("final_evaluation_on_eval_seeds", {}).items()}
    )
    rows = ["| games | vs weak: win / loss / draw | vs strong: win / loss / draw |", "| --- | --- | --- |"]
    for label, stats in games.items():
        cells = [
            " / ".join(_percent(stats[f"{o}/{r}_rate"]) for r in ("win", "loss", "draw"))
            for o in ("weak", "strong")
        ]
        rows.append(f"| {label} | {cells[0]} | {cells[1]} |")
    return "\n".join(rows)


def goal_check(name: str) -> str:
    """What TD-MPC2 hockey checkpoints know of goals (``tdmpc2_goal_check.json``): games, the reward
    predicted on scoring steps and the correlation of ``Q`` with the return that followed."""
    rows = [
        "| checkpoint | horizon, frames | games won / lost / drawn | predicted reward where a goal was "
        "scored (+10) | `Q` against the return that followed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, c in _result(name)["checkpoints"].items():
        scored, q = c["reward_on_goal_steps"]["scored"], c["q_vs_return"]["correlation"]
        rows.append(
            f"| `{label}` | {c['horizon']}, {c['frames']:,} | {' / '.join(map(str, c['win_loss_draw']))} "
            f"| {scored['predicted_mean']:.2f} ({scored['steps']} goals) | {q:.2f} |"
        )
    return "\n".join(rows)


def _rates(r: dict[str, Any]) -> str:
    """``win / loss / draw`` of an episode summary that has them, else its mean return."""
    if "win_rate" in r:
        return " / ".join(_percent(r[f"{k}_rate"]) for k in ("win", "loss", "draw"))
    return f"return {r['return_mean']:.1f}"


def planning_calibration(name: str) -> str:
    """``benchmarks/tdmpc2_planning.py``'s calibration: per checkpoint, scenario and way of acting, the
    outcome, how much the planner's objective and the critics over-state the return that followed, how
    often each ranks the plan above the prior, and how far apart the two actions are."""
    rows = [
        "| checkpoint (trained acting with) | scenario | acting | W / L / D or return | objective − return "
        "| Q − return | objective ranks plan first | Q ranks plan first | plan-prior distance |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, ck in _result(name)["checkpoints"].items():
        for scenario, sc in ck["scenarios"].items():
            for mode, c in sc["calibration"].items():
                rows.append(
                    f"| `{label}` ({ck['trained_acting_with']}) | {scenario} | {mode} | {_rates(c)} "
                    f"| {c['objective_taken_minus_return']:+.2f} | {c['q_taken_minus_return']:+.2f} "
                    f"| {_percent(c['share_objective_plan_above_prior'])} "
                    f"| {_percent(c['share_q_plan_above_prior'])} | {c['plan_prior_distance_mean']:.2f} |"
                )
    return "\n".join(rows)


def planning_sweep(name: str) -> str:
    """``benchmarks/tdmpc2_planning.py``'s sweep: the prior and each planner setting, per checkpoint and
    scenario (win / loss / draw at hockey, the mean return elsewhere)."""
    data = _result(name)["checkpoints"]
    columns = [(label, scenario) for label, ck in data.items() for scenario in ck["scenarios"]]
    rows = [
        "| acting | " + " | ".join(f"`{label}` {scenario}" for label, scenario in columns) + " |",
        "| --- |" + " --- |" * len(columns),
    ]
    settings = ["prior", *next(iter(data.values()))["scenarios"][columns[0][1]]["sweep"]]
    for setting in settings:
        cells = []
        for label, scenario in columns:
            sc = data[label]["scenarios"][scenario]
            cells.append(_rates(sc["prior"] if setting == "prior" else sc["sweep"][setting]))
        acting = "policy prior (mean)" if setting == "prior" else f"planner: {setting}"
        rows.append(f"| {acting} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _signed(x: float) -> str:
    return f"{100 * x:+.1f}%".replace("-", "−")


def trading(suite: str, entry: str) -> str:
    """A trading entry on its held-out period (``benchmarks/learning.py``'s trading hook): the baselines,
    then per seed ``best.ckpt`` (chosen on the validation period) and the last checkpoint, each beside a
    constant position at its own mean exposure where the results hold one."""
    data = _result(suite)["entries"][entry]
    summary, runs = data["summary"], sorted(data["seeds"].values(), key=lambda r: r["seed"])
    figures = ("total_return", "sharpe", "max_drawdown", "turnover_per_day", "mean_abs_position")
    rows = [
        "| policy | total return | Sharpe (annualised) | max drawdown | turnover per day "
        "| mean \\|position\\| |",
        "| --- | --- | --- | --- | --- | --- |",
    ]

    def cells(*records: dict[str, float]) -> str:
        def one(key: str, r: dict[str, float]) -> str:
            v = r[key]
            return _signed(v) if key == "total_return" else f"{100 * v:.1f}%" if key == "max_drawdown" else (
                f"{v:.2f}" if key == "sharpe" else f"{v:.3f}")  # fmt: skip

        return " | ".join(" / ".join(one(k, r) for r in records) for k in figures)

    for name, record in summary["baselines"]["test"].items():
        rows.append(f"| {name.replace('_', ' ')} | {cells(record)} |")
    for run in runs:
        best, last = run["test_best_ckpt"], run["test_last_ckpt"]
        chosen = run.get("best_ckpt_frames (chosen on validation)")
        rows.append(f"| seed {run['seed']}, `best.ckpt` ({chosen} frames) / last | {cells(best, last)} |")
        if "test_constant_exposure_best_ckpt" in run:
            constant = (run["test_constant_exposure_best_ckpt"], run["test_constant_exposure_last_ckpt"])
            rows.append(
                f"| seed {run['seed']}, each one's mean exposure held constant | {cells(*constant)} |"
            )
    return "\n".join(rows)


def _percent(rate: float) -> str:
    return f"{100 * rate:.1f}%"


def _wilson(interval: dict[str, float]) -> str:
    return f"[{_percent(interval['low'])}, {_percent(interval['high'])}]"


def hockey_agent(name: str) -> str:
    """A shipped hockey agent's test games (``benchmarks/ship_agent.py``): win, loss and draw rates per
    opponent with 95% Wilson intervals of the win and loss rates, for each way the agent was evaluated."""
    shipped = _result(name)["shipped"]
    modes = [(shipped, shipped.get("plan"))]
    if "other_mode" in shipped:
        modes.append((shipped["other_mode"], shipped["other_mode"]["plan"]))
    if "planner_variant" in shipped:
        modes.append((shipped["planner_variant"], shipped["planner_variant"]["planner"]))
    games = shipped["games_per_opponent"]
    rows = [
        "| acting | opponent | test games | win [95% CI] | loss [95% CI] | draw |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for record, plan in modes:
        acting = (
            "planning, " + ", ".join(f"{k} {v}" for k, v in plan.items())
            if isinstance(plan, dict)
            else {None: "its policy", True: "planning (MPPI)", False: "policy prior"}[plan]
        )
        for opponent, r in sorted(record["evaluation"].items(), key=lambda kv: kv[0] != "weak"):
            rows.append(
                f"| {acting} | {opponent} | {games} | {_percent(r['win'])} {_wilson(r['win_wilson'])} "
                f"| {_percent(r['loss'])} {_wilson(r['loss_wilson'])} | {_percent(r['draw'])} |"
            )
    return "\n".join(rows)


def marinenav_parity(name: str) -> str:
    """The pretrained policies in the public env and ours (``benchmarks/marinenav_parity.py``'s
    ``parity_table``): outcome counts, the tests per rate and the means over successful episodes."""
    return _benchmark("marinenav_parity").parity_table(_result(name))


def marinenav_speed(name: str) -> str:
    """Our marine-navigation env and acting loops against the public env's, robot steps per CPU second
    (``benchmarks/marinenav_parity.py --speed``'s ``speed_table``)."""
    return _benchmark("marinenav_parity").speed_table(_result(name))


#: Renderer name -> the function that renders its table from its arguments (the speed and memory tables'
#: renderers live in ``tables_speed.py`` beside this file).
TABLES: dict[str, Callable[..., str]] = {
    "readme": readme,
    "learning": learning,
    "learning_seeds": learning_seeds,
    "hockey_agent": hockey_agent,
    "iqn_hockey_risk": iqn_hockey_risk,
    "options_hockey": options_hockey,
    "hockey_seed": hockey_seed,
    "goal_check": goal_check,
    "trading": trading,
    "planning_calibration": planning_calibration,
    "planning_sweep": planning_sweep,
    "marinenav_parity": marinenav_parity,
    "marinenav_speed": marinenav_speed,
}


def _all_tables() -> dict[str, Callable[..., str]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        speed = importlib.import_module("tables_speed").TABLES
    finally:
        sys.path.remove(str(Path(__file__).resolve().parent))
    return {**TABLES, **speed}


def render(text: str) -> str:
    """``text`` with every marked table rendered again."""

    tables = _all_tables()

    def one(match: re.Match) -> str:
        name, *args = match.group("spec").split()
        if name not in tables:
            raise ValueError(f"unknown table renderer {name!r}; known: {', '.join(tables)}")
        return f"<!-- table: {match.group('spec')} -->\n{tables[name](*args)}\n<!-- /table -->"

    return MARKER.sub(one, text)


def drift() -> list[str]:
    """The ``page: table`` of every rendered table that differs from what its results give."""
    out = []
    for page in PAGES:
        text = page.read_text()
        rendered = render(text)
        if rendered != text:
            new = {m.group("spec"): m.group("body") for m in MARKER.finditer(rendered)}
            out += [f"{page.relative_to(ROOT)}: {m.group('spec')}" for m in MARKER.finditer(text)
                    if new.get(m.group("spec")) != m.group("body")]  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report tables that differ; change nothing")
    args = parser.parse_args()
    if args.check:
        stale = drift()
        for line in stale:
            print(f"stale: {line} (python docs/gen_tables.py renders it)")
        sys.exit(1 if stale else 0)
    for page in PAGES:
        text = page.read_text()
        rendered = render(text)
        if rendered != text:
            page.write_text(rendered)
            print(f"rendered the tables of {page.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
