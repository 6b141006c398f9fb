"""Committed benchmark results say what machine they ran on and hold no paths of that machine."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
ABSOLUTE = re.compile(r"(?<![\w.~])/(?:work|tmp|root|home|Users|var|private)/")


def strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_results_hold_relative_paths_only(path: Path) -> None:
    data = json.loads(path.read_text())
    found = [s for s in strings(data) if ABSOLUTE.search(s)]
    assert not found, f"{path.name} holds absolute paths: {found[:3]}"
    assert "machine" in data


def test_every_result_is_listed_with_the_command_that_reproduces_it() -> None:
    docs = (RESULTS.parents[1] / "docs" / "benchmarks.md").read_text()
    listed = set(re.findall(r"^\| `([\w.]+\.json)` \| ", docs, flags=re.MULTILINE))
    assert {p.name for p in RESULTS.glob("*.json")} <= listed


def test_benchmarks_are_at_most_15_scripts_each_listed_in_the_docs() -> None:
    # A script is a file one runs (helpers start with an underscore); docs/benchmarks.md says what each does.
    scripts = {p.name for p in RESULTS.parent.iterdir() if p.suffix in (".py", ".sh") and p.name[0] != "_"}
    docs = (RESULTS.parents[1] / "docs" / "benchmarks.md").read_text()
    described = set(re.findall(r"`(?:python |bash )?benchmarks/([\w.]+\.(?:py|sh))", docs))
    assert len(scripts) <= 15, sorted(scripts)
    assert scripts <= described, sorted(scripts - described)
