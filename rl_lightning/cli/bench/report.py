"""The bench's results: best of the rounds, ratios to the baseline, the table, MLflow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.run import make_logger
from rl_lightning.training.loggers import record_file

__all__ = ["FIGURES", "add_ratios", "best_of_rounds", "log_mlflow", "print_table"]

#: Figure -> True when higher is better.
FIGURES = {"env_fps": True, "updates_per_s": True, "act_ms": False, "peak_mem_mb": False}


def best_of_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return {"status": runs[-1]["status"], "runs": runs}
    out: dict[str, Any] = {"status": "ok", "runs": runs}
    for key, higher in FIGURES.items():
        values = [r[key] for r in ok if r.get(key) is not None]
        out[key] = (max if higher else min)(values) if values else None
    out["warmup_s"] = min(r["warmup_s"] for r in ok)
    out["memory"] = ok[0]["memory"]
    return out


def add_ratios(rows: list[dict[str, Any]]) -> None:
    base = rows[0]
    for row in rows:
        if row.get("status") != "ok":
            continue
        row["ratios"] = {
            key: (row[key] / base[key] if row.get(key) and base.get(key) else None) for key in FIGURES
        }


def _fmt(value: float | None, ratio: float | None) -> str:
    if value is None:
        return "-"
    digits = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2 if abs(value) >= 1 else 3
    text = f"{value:,.{digits}f}"
    return f"{text} ({ratio:.2f}x)" if ratio is not None else text


def _short(status: str, width: int = 50) -> str:
    text = status.split(" (see ")[0]
    return text if len(text) <= width else text[: width - 3] + "..."


def print_table(results: dict[str, Any]) -> None:
    """The results as a rich table: figures with their ratio to the baseline."""
    from rich.console import Console
    from rich.table import Table

    mem = next((r.get("memory") for r in results["variants"] if r.get("memory")), "memory")
    spread = results["baseline_spread"]
    table = Table(
        title=f"bench {results['experiment']} on {results['device']}, {results['frames']} frames "
        f"(x baseline; best of {results['repeats']})",
        caption=f"baseline frames/s spread over the rounds: {spread:.0%}" if spread is not None else None,
    )
    for header in ("variant", "env frames/s", "updates/s", "act ms", f"peak MB ({mem})", "warm-up s"):
        table.add_column(header, justify="left" if header == "variant" else "right")
    for row in results["variants"]:
        if row["status"] != "ok":
            # The whole message, with the log's path, is in the JSON.
            table.add_row(row["variant"], _short(row["status"]), "", "", "", "")
            continue
        r = row.get("ratios") or dict.fromkeys(FIGURES)
        table.add_row(
            row["variant"],
            _fmt(row["env_fps"], r["env_fps"]),
            _fmt(row["updates_per_s"], r["updates_per_s"]),
            _fmt(row["act_ms"], r["act_ms"]),
            _fmt(row["peak_mem_mb"], r["peak_mem_mb"]),
            f"{row['warmup_s']:.1f}",
        )
    Console(width=160).print(table)


def log_mlflow(cfg: DictConfig, results: dict[str, Any], run_dir: Path, json_path: Path) -> None:
    if not cfg.logger:
        return
    logger = make_logger(OmegaConf.merge(cfg, {"logger": {"run_name": f"{cfg.name}-bench"}}), run_dir)
    logger.log_hyperparams(
        {
            "experiment": cfg.name,
            "frames": results["frames"],
            "device": results["device"],
            "variants": ",".join(r["variant"] for r in results["variants"]),
            "repeats": results["repeats"],
            "torch_threads": str(results["torch_threads"]),
            "flush_denormal": str(results.get("flush_denormal")),
        }
    )
    metrics: dict[str, float] = {}
    for row in results["variants"]:
        if row["status"] != "ok":
            continue
        for key in (*FIGURES, "warmup_s"):
            if row.get(key) is not None:
                metrics[f"bench/{row['variant']}/{key}"] = float(row[key])
        for key, ratio in row.get("ratios", {}).items():
            if ratio is not None:
                metrics[f"bench/{row['variant']}/{key}_ratio"] = float(ratio)
    logger.log_metrics(metrics, step=0)
    record_file(logger, json_path, run_dir)
    logger.finalize("success")
