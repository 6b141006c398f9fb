"""The docs site builds, shows the configuration reference as written, and ships no build scripts."""

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
