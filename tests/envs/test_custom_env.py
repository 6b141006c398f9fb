"""A user's own env: ``module:Id`` and ``env.packages`` import and train, gymnasium's checker runs first,
and a checkpoint imports the env's module only when the command names it (docs/custom-env.md)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest
from helpers.cli import run_cli

from rl_lightning.envs.factory import EnvConfig, UnknownEnvError, check_env_id, check_spaces

DOCS = Path(__file__).resolve().parents[2] / "docs" / "custom-env.md"


def example_module() -> str:
    """The page's ``myenv.py``: its first Python block."""
    return re.search(r"```python\n(.*?)```", DOCS.read_text(), re.S).group(1)


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``tmp_path`` on the import path with the page's module as ``myenv_<n>`` and a broken one."""
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"myenv_{tmp_path.name.replace('-', '_')}"  # a module (and ids) of this test's own
    (tmp_path / f"{name}.py").write_text(example_module().replace('"MyEnv-v0"', f'"{name}/MyEnv-v0"'))
    (tmp_path / f"bad_{name}.py").write_text(
        f"import gymnasium as gym\nimport numpy as np\nfrom {name} import PointEnv\n\n\n"
        "class Bad(PointEnv):\n    def reset(self, *, seed=None, options=None):\n"
        "        super().reset(seed=seed)\n        return np.zeros(3, np.float32), {}\n\n\n"
        f'gym.register("{name}/Bad-v0", entry_point=Bad, max_episode_steps=5)\n'
    )
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    return tmp_path


def test_a_module_id_and_a_package_register_and_the_checker_runs(modules: Path) -> None:
    name = next(p.stem for p in modules.glob("myenv_*.py"))
    check_env_id(f"{name}:{name}/MyEnv-v0")  # imports the module, finds its id
    check_spaces(EnvConfig(id=f"{name}/MyEnv-v0", packages=[name]))  # the page's env passes the checker
    with pytest.raises(UnknownEnvError, match=rf"Module '{name}' registers no such id. Did you mean"):
        check_env_id(f"{name}:{name}/MyEnv-v1")
    with pytest.raises(UnknownEnvError, match="cannot import env package 'no_such_module'"):
        check_env_id("CartPole-v1", ["no_such_module"])
    with pytest.raises(UnknownEnvError, match="fails gymnasium's env checker: The first element returned"):
        check_spaces(EnvConfig(id=f"bad_{name}:{name}/Bad-v0"))


@pytest.mark.slow
def test_the_pages_example_trains_and_its_printed_evaluate_command_works(tmp_path: Path) -> None:
    (tmp_path / "myenv.py").write_text(example_module())
    fit = run_cli(tmp_path, "fit", "algo=sac", "env.id=myenv:MyEnv-v0", "total_frames=2000", "logger=none",
                  "progress_bar=false", "eval.episodes=3")  # fmt: skip
    assert fit.returncode == 0, fit.stderr[-2000:]
    printed = next(line for line in fit.stdout.splitlines() if "evaluate it:" in line)
    command = shlex.split(printed.split("evaluate it:", 1)[1])
    assert command[:3] == ["python", "-m", "rl_lightning"] and command[-1] == "env.packages=[myenv]"
    evaluated = run_cli(tmp_path, *command[3:], "episodes=5", "logger=none")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "test: 5 episodes" in evaluated.stdout
    # Without the module named, the checkpoint is refused in one line: it never imports code by itself.
    refused = run_cli(tmp_path, *command[3:-1], "logger=none")
    assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
        "error: this checkpoint's env (myenv:MyEnv-v0) needs module(s) myenv, and a checkpoint never imports "
        "code by itself: name them to import them, env.packages=[myenv]."
    ]
    resumed = run_cli(tmp_path, "fit", "algo=sac", "env.id=myenv:MyEnv-v0", "total_frames=2200",
                      "logger=none", "progress_bar=false", "eval.episodes=3", "ckpt_path=last")  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-2000:]
