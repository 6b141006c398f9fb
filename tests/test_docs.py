"""The docs site builds, shows the configuration reference as written, ships no build scripts, and every
rendered table of figures is what its results JSON gives."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))

import gen_config_reference  # noqa: E402
import gen_tables  # noqa: E402
import tables_speed  # noqa: E402


def test_every_rendered_table_is_its_results() -> None:
    """README.md's and docs/'s tables of figures are what ``python docs/gen_tables.py`` renders from the
    results they name: a figure typed by hand, or a result that moved on, fails here."""
    assert gen_tables.drift() == []


def test_every_speed_table_renders_from_its_results() -> None:
    """Every renderer of ``tables_speed.py`` has a table on a page, and each such table renders from the
    results it names into a header, its separator and rows of as many cells."""
    pages = [page.read_text() for page in gen_tables.PAGES]
    specs = [m["spec"].split() for text in pages for m in gen_tables.MARKER.finditer(text)]
    assert set(tables_speed.TABLES) <= {name for name, *_ in specs}, "a renderer no page uses"
    for name, *args in specs:
        if name not in tables_speed.TABLES:
            continue
        lines = tables_speed.TABLES[name](*args).splitlines()
        widths = {line.count("|") for line in lines}
        assert len(lines) > 2 and len(widths) == 1, (name, args)
        assert lines[1] == "|" + " --- |" * (widths.pop() - 1), (name, args)


def test_a_table_that_differs_from_its_results_is_named(tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("x\n<!-- table: hockey_agent hockey_agent -->\n| made up |\n<!-- /table -->\ny\n")
    monkeypatch.setattr(gen_tables, "PAGES", (page,))
    monkeypatch.setattr(gen_tables, "ROOT", tmp_path)
    assert gen_tables.drift() == ["page.md: hockey_agent hockey_agent"]
    page.write_text(gen_tables.render(page.read_text()))
    assert gen_tables.drift() == [] and "| acting | opponent | test games |" in page.read_text()


def test_reference_escapes_placeholders_in_comments() -> None:
    text = gen_config_reference.render()
    outside_code = re.sub(r"`[^`]*`", "", text)
    assert not re.findall(r"<[a-z_]+>", outside_code), "a <placeholder> a browser would swallow"
    assert "runs/&lt;name&gt;/&lt;timestamp&gt;" in text


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("mkdocs") is None, reason="mkdocs is a dev dependency")
def test_site_builds_strictly_without_the_generator_script(tmp_path: Path) -> None:
    site = tmp_path / "site"
    proc = subprocess.run(
        ["mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list(site.rglob("*.py"))
    html = (site / "reference" / "configuration" / "index.html").read_text()
    assert "runs/&lt;name&gt;/&lt;timestamp&gt;" in html
    assert "runs/${name}/${now:%Y%m%d-%H%M%S}" in html
    # The learning curves of the benchmarks, drawn at the build.
    curves = (site / "learning-curves" / "index.html").read_text()
    assert 'src="../images/curves/dqn_cartpole.png"' in curves
    assert (site / "images" / "curves" / "dqn_cartpole.png").read_bytes()[:4] == b"\x89PNG"
