"""Ships ``conf/`` (the Hydra config, kept at the top of the repository) inside the built package.

A wheel gets a copy of ``conf/`` as ``rl_lightning/conf``, so ``pip install .`` works from any directory;
an editable install reads ``conf/`` in place (``rl_lightning.cli.config.CONF_DIR`` looks for both).
Everything else is declared in ``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithConf(build_py):
    """``build_py`` that also copies ``conf/`` to ``<build>/rl_lightning/conf``."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / "rl_lightning" / "conf"
            shutil.copytree(ROOT / "conf", target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.pyc"))


setup(cmdclass={"build_py": BuildPyWithConf})
