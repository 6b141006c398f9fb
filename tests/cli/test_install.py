"""A built wheel carries the config: `pip install .` works from any directory, not only editable installs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_wheel_ships_the_config_and_fits_from_an_unrelated_directory(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", str(ROOT), "-w", str(dist)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("rl_lightning-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {n.removeprefix("rl_lightning/conf/") for n in names if n.startswith("rl_lightning/conf/")}
    expected = {str(p.relative_to(ROOT / "conf")) for p in (ROOT / "conf").rglob("*.yaml")}
    assert expected <= shipped
    assert "callbacks/__init__.py" in names
    # Installed (not editable) into its own directory, run from a directory that holds no conf/.
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site), str(wheel)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONWARNINGS": "ignore"}
    where = subprocess.run(
        [sys.executable, "-c", "import rl_lightning.cli.config as c; print(c.CONF_DIR)"],
        cwd=elsewhere, capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    assert Path(where.stdout.strip()) == site / "rl_lightning" / "conf"
    proc = subprocess.run(
        [sys.executable, "-m", "rl_lightning", "fit", "+experiment=dqn_cartpole", "+debug=quick"],
        cwd=elsewhere, capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["frames"] == 500
