"""Renderers of the speed and memory tables in docs/ (``docs/gen_tables.py`` merges them with its own).

Each renderer takes the name of a JSON in ``benchmarks/results/`` (without ``.json``) and returns the table's
rows. Figures are rounded half up from the value the JSON stores, as they were typed before.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"


def _result(name: str) -> dict[str, Any]:
    """``benchmarks/results/<name>.json``."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def _fix(x: float, decimals: int) -> str:
    """``x`` with ``decimals`` decimals, rounded half up from its shortest repr (0.585 -> 0.59)."""
    return f"{Decimal(repr(x)).quantize(Decimal(1).scaleb(-decimals), rounding=ROUND_HALF_UP):f}"


def _sig(x: float, digits: int = 3, most: int | None = None) -> str:
    """``x`` with ``digits`` significant figures (and at most ``most`` decimals)."""
    if x == 0:
        return "0"
    decimals = max(0, digits - 1 - Decimal(repr(x)).adjusted())
    return _fix(x, decimals if most is None else min(decimals, most))


def _short(x: float, decimals: int) -> str:
    """``x`` with at most ``decimals`` decimals, trailing zeros dropped (0.50 -> 0.5, 0.00 -> 0)."""
    text = _fix(x, decimals)
    return text.rstrip("0").rstrip(".") if "." in text else text


def _x(ratio: float, decimals: int = 2) -> str:
    """A ratio as ``1.23×``."""
    return f"{_fix(ratio, decimals)}×"


def _table(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table of ``header`` and ``rows`` (an empty cell as ``| |``)."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|" for cells in lines)


def image_replay(name: str) -> str:
    """``image_replay.json``: bytes per stored transition, frames once against whole rows (images.md)."""
    prefixes = {"atari": "Atari", "minatar": "MinAtar"}
    rows = []
    for key, game in _result(name)["games"].items():
        kind, *words = key.split("_")
        size = game["bytes_per_transition"]
        rows.append(
            [
                f"{prefixes[kind]} {''.join(w.capitalize() for w in words)}",
                f"`{game['observation_shape']}` uint8",
                f"{_fix(size['frames_once'], 0)} B ({_fix(game['frames_per_transition'], 2)} frames)",
                f"{size['whole_rows']} B",
                f"{_short(game['whole_rows_over_frames_once'], 2)}x",
            ]
        )
    return _table(["game", "observation", "frames once", "whole rows", "ratio"], rows)


def image_dqn_speed(name: str) -> str:
    """``image_dqn_speed.json``: DQN from pixels, frames/s against a hand-written loop and SB3 (images.md)."""
    prefixes = {"MinAtar": "MinAtar", "ALE": "Atari"}
    rows = []
    for game in _result(name)["games"].values():
        suite, env = game["env"].split("/")
        frames = round(1 / game["updates_per_frame"])
        per = "frame" if frames == 1 else f"{frames} frames"
        fps, ratio = game["frames_per_s"], game["ratio_to_rl_lightning"]
        rows.append(
            [
                f"{prefixes[suite]} {env.split('-')[0]}",
                f"`{game['experiment']}`: one update per {per}",
                _fix(fps["rl_lightning"], 1),
                *(f"{_fix(fps[side], 1)} ({_fix(ratio[side], 2)}x)" for side in ("hand_written", "sb3")),
            ]
        )
    return _table(["game", "recipe", "rl_lightning", "hand-written loop", "Stable-Baselines3"], rows)


def _spaced(n: float) -> str:
    """A whole number with spaces between its thousands (10 240)."""
    return f"{int(_fix(n, 0)):,}".replace(",", " ")


def scaling_ddp(name: str) -> str:
    """``scaling.json``: DQN CartPole with ``trainer=ddp`` against one process, per seed (scaling.md)."""
    runs = _result(name)["ddp"]["runs"]
    seeds = sorted({r["seed"] for r in runs})
    frames = runs[0]["frames"] // 1000
    labels = {
        "ddp_2_processes": f"DQN CartPole, {frames}k frames in total, `trainer=ddp` (2 processes, gloo): "
        "best eval / first ≥ 475 / wall",
        "one_process": "the same in one process",
    }
    cell = {(r["mode"], r["seed"]): r for r in runs}
    rows = [
        [label]
        + [
            f"{_fix(r['best_eval'], 0)} / {_spaced(r['first_at_475'])} frames / {_fix(r['wall_s'], 0)} s"
            for r in (cell[mode, s] for s in seeds)
        ]
        for mode, label in labels.items()
    ]
    return _table(["run", *(f"seed {s}" for s in seeds)], rows)


def ray_collect(name: str) -> str:
    """``ray_collect.json``: one process, worker processes and Ray actors, medians (scaling.md)."""
    result = _result(name)
    collection, fit = result["collection"], result["fit"]
    labels = {
        "one_process": "one process (`collect.workers=0`)",
        "multisync_2_workers": "2 worker processes (`collect.workers=2`)",
        "ray_2_actors": "2 Ray actors (`collect.backend=ray collect.workers=2`)",
    }
    rows = [
        [
            label,
            f"{_short(collection['median_start_s'][mode], 2)} s",
            f"{int(_fix(collection['median_frames_per_s'][mode], 0)):,}",
            f"{_fix(fit['median_wall_s'][mode], 1)} s",
        ]
        for mode, label in labels.items()
    ]
    header = ["", "start-up", "collection (frames/s)", f"`fit +debug=quick` ({fit['frames']} frames), wall"]
    return _table(header, rows)


def bench_cpu(*names: str) -> str:
    """``bench_cpu_<experiment>.json`` per experiment: `compile`, `fast` against none (optimizations.md)."""
    rows = []
    for experiment in names:
        result = _result(f"bench_cpu_{experiment}")
        variants = {v["variant"]: v for v in result["variants"] if v["status"] == "ok"}
        rounds = result["repeats"]
        spread = result["baseline_spread"]
        rows.append(
            [
                f"`{experiment}` (`bench_cpu_{experiment}.json`, {rounds} round{'s' * (rounds > 1)})",
                *(
                    _x(variants[v]["ratios"]["env_fps"]) if v in variants else "–"
                    for v in ("compile", "fast")
                ),
                f"{_sig(variants['baseline']['act_ms'])} → {_sig(variants['fast']['act_ms'])} ms",
                "–" if spread is None else f"{_fix(100 * spread, 0)}%",
            ]
        )
    header = ["experiment", "`compile`, frames/s", "`fast`, frames/s", "plan (`act`), eager → `fast`"]
    return _table([*header, "baseline spread"], rows)


def tdmpc2_compile(name: str) -> str:
    """``tdmpc2_compile.json``: the MPPI iteration as a compile region against unrolled (optimizations.md)."""
    result = _result(name)
    summary = result["summary"]
    labels = {"regions": "the iteration as a region", "unrolled": "the loop unrolled"}
    rows = [
        [
            label,
            f"{_fix(summary['compile_s_median'][way], 1)} s",
            str(result["compile_runs"][way][0]["generated_kernels"]),
            _sig(summary["ms_median"][way]),
        ]
        for way, label in labels.items()
    ]
    header = ["plan (`act`)", "first call (compile + one plan)", "Inductor kernels", "ms per plan after"]
    return _table(header, rows)


def compile_regions(name: str) -> str:
    """``compile_regions.json``: `update`'s losses compiled as regions or whole (optimizations.md)."""
    rows = []
    for experiment, r in _result(name)["results"].items():
        regions, whole = r["regions"], r["whole"]
        rows.append(
            [
                f"`{experiment}`",
                f"{_fix(regions['compile_s'], 1)} / {_fix(whole['compile_s'], 1)} s",
                _fix(r["compile_ratio_regions_to_whole"], 2),
                f"{regions['frames']} / {whole['frames']}",
                f"{_sig(regions['update_ms'])} / {_sig(whole['update_ms'])} ms",
            ]
        )
    header = ["experiment", "compile, regions / whole", "ratio", "compiled frames"]
    return _table([*header, "steady update, regions / whole"], rows)


def denormals(name: str) -> str:
    """``denormals.json``: whole fits with subnormal floats flushed and kept (optimizations.md)."""
    result = _result(name)
    rows = []
    for task, s in result["summary"].items():
        frames = result["fits"][task][0]["curve"][-1][0] // 1000
        flush, keep = s["steady_ms_per_frame_flush"], s["steady_ms_per_frame_keep"]
        rows.append(
            [
                f"`{task}`, {frames}k frames",
                f"{_sig(flush)} / {_sig(keep)}",
                _fix(flush / keep, 2),
                f"{_fix(s['wall_s_flush'], 1)} / {_fix(s['wall_s_keep'], 1)} s",
            ]
        )
    header = ["fit", "steady ms per frame, flushed / kept", "ratio", "wall, flushed / kept"]
    return _table(header, rows)


def slice_sampler(name: str, sampler: str) -> str:
    """``slice_sampler.json``: ms per cycle, TorchRL's sampler against the project's (``interleaved`` or
    ``adjacent``; benchmarks.md)."""
    rows = [
        [
            f"{r['fill']:,}",
            f"{_fix(r['torchrl_ms_per_cycle'], 2)} ms",
            f"{_fix(r['ours_ms_per_cycle'], 2)} ms",
            _x(r["speedup"]),
        ]
        for r in _result(name)[sampler]["results"]
    ]
    return _table(["fill", "TorchRL", "project", "ratio"], rows)


#: Stable-Baselines3 comparison: task -> its name and the decimals of its evaluations.
_SB3_TASKS = {"dqn_cartpole": ("DQN CartPole", 0), "sac_pendulum": ("SAC Pendulum", 1)}


def sb3_compare(name: str, kind: str) -> str:
    """``sb3_compare*.json``: the whole runs against Stable-Baselines3 (benchmarks.md), ``kind`` ``wall``
    (wall / best / final), ``steady`` (steady / fixed) or ``back_to_back`` (wall / steady / fixed)."""
    result = _result(name)
    columns = {
        "wall": ("wall / best / final", "wall ratio"),
        "steady": ("steady / fixed", "steady ratio"),
        "back_to_back": ("wall / steady / fixed", "wall ratio"),
    }[kind]
    ratio = columns[1].replace(" ", "_")
    rows = []
    for task, s in result["summary"].items():
        label, decimals = _SB3_TASKS[task]
        runs = [r for r in result["runs"] if r["task"] == task]
        if kind == "wall":
            label += f", {runs[0]['rl_lightning']['curve'][-1][0] // 1000}k frames"
        cells = []
        for side in ("rl_lightning", "stable_baselines3"):
            wall = f"{_sig(s[f'{side}_wall_s_mean'])} s"
            steady = _sig(s[f"{side}_steady_ms_per_frame_mean"], most=2)
            fixed = f"{_fix(s[f'{side}_fixed_s_mean'], 1)} s"
            evals = [_fix(s[f"{side}_{e}_eval_mean"], decimals).replace("-", "−") for e in ("best", "final")]
            cells.append(
                {
                    "wall": f"{wall} / {evals[0]} / {evals[1]}",
                    "steady": f"{steady} ms/frame / {fixed}",
                    "back_to_back": f"{wall} / {steady} ms / {fixed}",
                }[kind]
            )
        seeds = ", ".join(_fix(r[ratio], 2) for r in runs)
        rows.append([label, *cells, f"{_fix(s[f'{ratio}_mean'], 2)} ({seeds})"])
    header = ["task", f"rl_lightning {columns[0]}", f"Stable-Baselines3 {columns[0]}"]
    return _table([*header, columns[1]], rows)


def plan_kernels(name: str) -> str:
    """``gpu_suite_*.json``'s ``plan_default`` step: the plan's time and kernels, eager, compiled and graphed,
    with side-stream heads (benchmarks.md)."""
    labels = {
        ("eager", "separate"): "eager",
        ("compiled_graphs", "separate"): "compiled + CUDA-graphed (as `fast`)",
        ("compiled_graphs", "streams"): "the same with side-stream heads",
    }
    rows = []
    for r in _result(name)["steps"]["plan_default"]["results"]:
        label = labels.get((r["variant"], r["heads"]))
        if label is None:
            continue
        streams = r["heads"] == "streams"
        rows.append(
            [
                label,
                _sig(r["ms_median"]) + (f" ({_x(r['ms_ratio_to_separate'])})" if streams else ""),
                _fix(r["kernels_per_plan"], 0),
                f"{_sig(r['kernel_ms_per_plan'])} ms" + (" (side by side)" if streams else ""),
            ]
        )
    return _table(["plan", "ms", "kernels per plan", "their summed time"], rows)


def plan_precisions(name: str) -> str:
    """``tdmpc2_plan_latency_cuda.json``: the plan per precision, eager, graphed, compiled and graphed, and
    the eager plan's kernels (benchmarks.md)."""
    labels = {"fp32": "fp32", "tf32": "TF32, as `fast` sets it", "bf16": "bf16 autocast, on TF32"}
    runs = {(r["precision"], r["variant"]): r for r in _result(name)["results"]}
    rows = []
    for precision, label in labels.items():
        eager, graphs, both = (runs[precision, v] for v in ("eager", "cuda_graphs", "compiled_graphs"))
        rows.append(
            [
                label,
                f"{_sig(eager['ms_median'])} ms",
                f"{_sig(graphs['ms_median'])} ms",
                f"{_sig(both['ms_median'])} ms ({_fix(both['compile_s'], 0)} s)",
                f"{_fix(eager['kernels_per_plan'], 0)} ({_sig(eager['kernel_ms_per_plan'])} ms)",
            ]
        )
    header = ["precision", "eager", "CUDA graphs", "compile + CUDA graphs (compile time)"]
    return _table([*header, "kernels per eager plan (their summed time)"], rows)


def _goal(figures: dict[str, Any], key: str, text: str) -> str:
    """A GPU suite's goal ``text`` and whether its figures met it."""
    return f"goal {text}: {'met' if figures['goals_met'][key] else 'not met'}"


def _act_ms(variant: dict[str, Any]) -> str:
    """A bench variant's ``act`` latency."""
    return f"{_sig(variant['act_ms'], most=2)} ms"


def _fps(variant: dict[str, Any]) -> str:
    """A bench variant's env frames/s."""
    return _sig(variant["env_fps"])


def _mb(*variants: dict[str, Any]) -> str:
    """Bench variants' peak memory, ``a / b MB``."""
    return " / ".join(_fix(v["peak_mem_mb"], 0) for v in variants) + " MB"


def gpu_suite_h200(name: str) -> str:
    """``gpu_suite_nvidia_h200.json``: the latest call's TD-MPC2 benches beside the earlier calls' TD-MPC2,
    SAC and DQN benches (benchmarks.md)."""
    latest = _result(name)
    before = latest["earlier"]
    first = before["earlier"]
    one, eight = (latest["steps"][b]["variants"] for b in ("bench_tdmpc2", "bench_tdmpc2_8envs"))
    one_before = before["steps"]["bench_tdmpc2"]["variants"]
    one_first, sac, dqn = (first["steps"][b]["variants"] for b in ("bench_tdmpc2", "bench_sac", "bench_dqn"))
    graphs, figures, goals = one_first["cuda_graphs"], latest["figures"], latest["figures"]["goals"]
    speedup, latency = goals["tdmpc2_plan_graphed_speedup"], goals["tdmpc2_plan_graphed_ms"]
    plan_goals = (
        f"{_goal(figures, 'tdmpc2_plan_graphed_speedup', f'≥ {speedup:g}×')}; "
        f"{_goal(figures, 'tdmpc2_plan_graphed_ms', f'< {latency:g} ms')}"
    )
    fps_goal = f"{goals['tdmpc2_hockey_fast_env_fps']:g}"
    sac_goal = f"≥ {before['figures']['goals']['sac_fast_updates_speedup']:g}×"
    earlier_plans = f"{_sig(one_before['baseline']['act_ms'])} and {_sig(one_first['baseline']['act_ms'])}"
    earlier_fps = f"{_fps(one_before['baseline'])} and {_fps(one_first['baseline'])}"
    plan_ratios = (
        f"{_x(figures['tdmpc2_plan_graphed_speedup'], 1)} this run's eager, "
        f"{_x(before['figures']['tdmpc2_plan_graphed_speedup'], 1)} the run before"
    )
    fast = one["fast"]
    rows = [
        [
            "TD-MPC2 hockey: plan (`act`, 50 calls back to back)",
            f"{_act_ms(one['baseline'])} ({earlier_plans} earlier)",
            f"{_act_ms(graphs)} ({_x(1 / graphs['ratios']['act_ms'], 1)}, earlier)",
            f"{_act_ms(fast)} ({plan_ratios}; {plan_goals})",
        ],
        [
            "TD-MPC2 hockey: env frames/s (one env, one update a frame)",
            f"{_fps(one['baseline'])} ({earlier_fps} earlier)",
            f"{_fps(graphs)} ({_x(graphs['ratios']['env_fps'], 1)}, earlier)",
            f"{_fps(fast)} ({_x(fast['ratios']['env_fps'], 1)}; {_fps(one_before['fast'])} earlier; "
            f"{_goal(figures, 'tdmpc2_hockey_fast_env_fps', fps_goal)})",
        ],
        [
            "TD-MPC2 hockey, 8 envs per plan (one update an env frame): env frames/s",
            _fps(eight["baseline"]),
            "–",
            f"{_fps(eight['fast'])} ({_x(eight['fast']['ratios']['env_fps'], 1)}; "
            f"{_goal(figures, 'tdmpc2_hockey_fast_env_fps_8_envs', fps_goal)})",
        ],
        [
            "TD-MPC2 hockey, 8 envs per plan: plan for the 8",
            _act_ms(eight["baseline"]),
            "–",
            _act_ms(eight["fast"]),
        ],
        [
            "SAC Pendulum: updates/s (earlier)",
            _sig(sac["baseline"]["updates_per_s"]),
            "–",
            f"{_sig(sac['fast']['updates_per_s'])} ({_x(sac['fast']['ratios']['updates_per_s'], 1)}, "
            f"{_goal(before['figures'], 'sac_fast_updates_speedup', sac_goal)})",
        ],
        ["SAC Pendulum: `act` (earlier)", _act_ms(sac["baseline"]), "–", _act_ms(sac["fast"])],
        [
            "DQN CartPole: env frames/s (earlier)",
            _fps(dqn["baseline"]),
            "–",
            f"not run: the step {first['steps']['bench_dqn']['status']}",
        ],
        [
            "peak GPU memory (TD-MPC2 / 8 envs / SAC / DQN)",
            _mb(one["baseline"], eight["baseline"], sac["baseline"], dqn["baseline"]),
            f"{_mb(graphs)} (TD-MPC2)",
            f"{_mb(fast, eight['fast'])} (TD-MPC2 / 8 envs), {_mb(sac['fast'])} (SAC)",
        ],
    ]
    header = ["", "eager", "`cuda_graphs`", "`fast` (compile + CUDA graphs + TF32 + fused optimizer)"]
    return _table(header, rows)


def _per_call(part: dict[str, Any]) -> float:
    """How many frames one call of a part serves (its time per call over its time per frame)."""
    return part["us_per_call"] / part["us_per_frame"]


def fit_parts_frame(*names: str) -> str:
    """``fit_parts_*.json`` of synchronised GPU fits, a column each: ms per frame by part (benchmarks.md)."""
    columns = []
    for name in names:
        parts = _result(name)["parts"]
        act, sample, collection = parts["act"], parts["replay_sample"], parts["collection"]
        envs = round(_per_call(act))
        ms = {key: _fix(part["us_per_frame"] / 1000, 2) for key, part in parts.items()}
        if envs > 1:
            ms["act"] += f" ({_fix(act['us_per_call'] / 1000, 2)} a plan of {envs})"
            ms["replay_sample"] += f" ({_fix(sample['us_per_call'] / 1000, 2)} a sample)"
        ms["rest"] = _fix((collection["us_per_frame"] - act["us_per_frame"]) / 1000, 2)
        label = "one env" if envs == 1 else f"{envs} envs per plan"
        columns.append((f"{label} (`{name}.json`)", ms))
    labels = {
        "act": "`act` (the plan)",
        "rest": "the rest of the collector's step (env step, transfers)",
        "add_frames": "`add_frames`",
        "replay_sample": "replay samples",
        "training_step": "whole frame (`training_step`)",
    }
    rows = [[label, *(ms[key] for _, ms in columns)] for key, label in labels.items()]
    return _table(["ms per frame", *(header for header, _ in columns)], rows)


def fit_parts_ops(name: str) -> str:
    """``fit_parts_*_ops.json``: operations that do work and host reads per frame, by part (benchmarks.md)."""
    parts = _result(name)["parts"]
    act, collection = parts["act"], parts["collection"]
    parts["rest"] = {key: collection[key] - act[key] for key in ("ops_per_frame", "host_reads_per_frame")}

    def cell(part: str, key: str, decimals: int, per: str | None) -> str:
        """The part's figure per frame, and per call (``per``) where it is not zero."""
        value = parts[part][key]
        text = _short(value, decimals)
        if per is None or value == 0:
            return text
        return f"{text} ({_short(value * _per_call(parts[part]), decimals - 1)} {per})"

    labels = {
        "update": ("update (graphed on a GPU)", "an update"),
        "act": ("plan (`act`, graphed on a GPU)", f"a plan of {round(_per_call(act))} envs"),
        "rest": ("the rest of the collector's step", None),
        "add_frames": ("`add_frames` (statistics, the replay write)", None),
        "replay_sample": ("replay sample", "a sample"),
    }
    rows = [
        [label, cell(part, "ops_per_frame", 1, per), cell(part, "host_reads_per_frame", 2, per)]
        for part, (label, per) in labels.items()
    ]
    return _table(["part", "operations", "host reads"], rows)


#: Renderer name -> the function that renders its table from its arguments.
TABLES: dict[str, Callable[..., str]] = {
    "bench_cpu": bench_cpu,
    "compile_regions": compile_regions,
    "denormals": denormals,
    "fit_parts_frame": fit_parts_frame,
    "fit_parts_ops": fit_parts_ops,
    "gpu_suite_h200": gpu_suite_h200,
    "image_dqn_speed": image_dqn_speed,
    "image_replay": image_replay,
    "plan_kernels": plan_kernels,
    "plan_precisions": plan_precisions,
    "ray_collect": ray_collect,
    "scaling_ddp": scaling_ddp,
    "sb3_compare": sb3_compare,
    "slice_sampler": slice_sampler,
    "tdmpc2_compile": tdmpc2_compile,
}
