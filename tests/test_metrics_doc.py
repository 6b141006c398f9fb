"""docs/metrics.md names every key a run logs: each algorithm's update metrics in its algorithm's row, and
a real run's keys.

A documented key may hold a placeholder (``options/usage_<k>``, ``eval/<variant>/<key>``), which stands for
one path segment or part of one. An update's metric ``name`` is logged as ``train/<name>`` unless it names a
group of its own (``options/usage_min``), as ``UpdateFeedback`` does.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from helpers.equivalence import ALGORITHMS

from rl_lightning.algos.base import PRIORITY_KEY
from rl_lightning.cli import compose, main
from rl_lightning.cli.run import build_module, env_config

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
#: Every algorithm, clipping its gradients (so that the grad_norm keys are logged too).
CASES = {name: ([*overrides, "algo.grad_clip=10.0"], data) for name, (overrides, data) in ALGORITHMS.items()}


#: The rows (``algo=NAME``) that document a case's keys, where not its own name: Rainbow is C51 with flags,
#: and SAC with options logs SAC's keys and its own.
ROWS_OF = {"rainbow": ("c51",), "sac_options": ("sac_options", "sac"), "ppo_continuous": ("ppo",)}


def documented(algos: tuple[str, ...] | None = None) -> list[re.Pattern]:
    """The keys in backticks in the rows of the doc's tables (``algos``: the rows that name ``algo=NAME``),
    as patterns (a ``<placeholder>`` matches within a segment)."""
    lines = DOC.read_text().splitlines()
    rows = "\n".join(
        line
        for line in lines
        if line.startswith("|") and (algos is None or any(f"`algo={a}`" in line for a in algos))
    )
    assert rows, f"docs/metrics.md has no row for algo={algos}"
    keys = re.findall(r"`([a-z_]+/[^`\s]+)`", rows)
    return [re.compile("".join(_pattern(part) for part in re.split(r"(<[^>]+>)", k))) for k in keys]


def _pattern(part: str) -> str:
    return "[^/]+" if part.startswith("<") else re.escape(part)


def undocumented(keys: set[str], algos: tuple[str, ...] | None = None) -> list[str]:
    patterns = documented(algos)
    return sorted(k for k in keys if not any(p.fullmatch(k) for p in patterns))


def logged_name(name: str) -> str:
    return name if "/" in name else f"train/{name}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_update_metric_is_documented(name: str) -> None:
    overrides, make_data = CASES[name]
    cfg = compose([*overrides, "device=cpu"])
    torch.manual_seed(0)
    module = build_module(cfg, env_config(cfg))
    batches, _ = make_data(module, k=2)
    keys = set()
    for batch in batches:  # two updates: TD3-style delayed actors log their keys on the second
        out = module.update(module.prepare_sample(batch.clone()))
        keys |= {logged_name(k) for k in out.keys() if k != PRIORITY_KEY}
    rows = ROWS_OF.get(name, (name,))
    assert keys and not undocumented(keys, rows), undocumented(keys, rows)


def test_the_keys_of_a_real_run_are_documented(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["fit", "+experiment=dqn_cartpole", "+debug=quick", "device=cpu", "logger=csv",
            "callbacks.throughput.log_every_n_steps=1", "log_every_n_updates=50"]  # fmt: skip
    assert main(args) == 0
    run_dir = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["run_dir"]
    with (tmp_path / run_dir / "csv" / "metrics.csv").open() as fh:
        keys = set(next(csv.reader(fh))) - {"step"}
    assert {"train/episode_return", "eval/return_mean", "time/env_sps"} <= keys
    assert not undocumented(keys), undocumented(keys)


def test_an_undocumented_key_is_found() -> None:
    assert undocumented({"train/loss", "options/usage_3", "train/not_a_metric"}) == ["train/not_a_metric"]
    sacs = undocumented({"train/loss", "train/loss_qvalue"}, ("dqn",))
    assert sacs == ["train/loss_qvalue"]  # SAC's, not DQN's
