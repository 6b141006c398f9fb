"""Shared helpers for the benchmark scripts: machine description, JSON output, the CLI as a subprocess, a
module as an earlier revision had it."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """What the figures were measured on: platform, CPU, cores, load, device and library versions."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpu": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    }
    for name in ("torch", "torchrl", "tensordict", "lightning", "gymnasium", "box2d"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info[name] = metadata.version(name)
    return info


_ABSOLUTE = re.compile(r"(?<![\w.~])/(?:[\w.@+=-]+/)*[\w.@+=-]+")


def _relative(match: re.Match) -> str:
    path = Path(match.group(0))
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    parts = path.parts
    # A run of the CLI in some work directory: keep what follows the directory the run was made in.
    if "runs" in parts:
        return str(Path(*parts[parts.index("runs") :]))
    return path.name


def relative_paths(value: Any) -> Any:
    """``value`` with every absolute path made relative to the repository (or cut to its run-relative tail).

    Results are committed and read on other machines: a path of this machine says nothing there.
    """
    if isinstance(value, str):
        return _ABSOLUTE.sub(_relative, value)
    if isinstance(value, dict):
        return {k: relative_paths(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [relative_paths(v) for v in value]
    return value


#: The running benchmark script, resolved before it can change directory (fit_parts).
SCRIPT = Path(sys.argv[0]).resolve()


def command_line() -> str:
    """How this benchmark was started, from the repository root."""
    shown = SCRIPT.relative_to(ROOT) if SCRIPT.is_relative_to(ROOT) else SCRIPT.name
    return " ".join(["python", str(shown), *sys.argv[1:]])


def cli(cwd: Path, log: Path, *args: str) -> str:
    """``python -m rl_lightning ARGS`` in ``cwd`` with one OpenMP thread; its stderr and stdout are appended
    to ``log``. Returns the last line of stdout (``fit`` and ``evaluate`` print their JSON summary there) and
    raises ``RuntimeError`` naming ``log`` if the command fails."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with log.open("a") as fh:
        proc = subprocess.run(
            [sys.executable, "-m", "rl_lightning", *args], cwd=cwd, stdout=subprocess.PIPE, stderr=fh,
            text=True, env=env,
        )  # fmt: skip
        fh.write(proc.stdout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed (exit {proc.returncode}); see {log}")
    return proc.stdout.strip().splitlines()[-1]


def module_at(rev: str, path: str) -> ModuleType:
    """The module ``path`` (relative to the repository, e.g. ``rl_lightning/data/nstep.py``) as it was at the
    git revision ``rev``, read with ``git show`` and loaded apart from this tree's; its own imports resolve to
    this tree's modules. For timing code against an earlier revision of itself in one process."""
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    name = re.sub(r"\W", "_", f"{Path(path).stem}_at_{rev}")
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def override_value(overrides: list[str], key: str, default: str | None = None) -> str | None:
    """The value a list of CLI overrides gives ``key`` (``key=VALUE``, e.g. ``+experiment``), else
    ``default``."""
    return next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")), default)


def experiment_of(overrides: list[str], default: str = "fit") -> str:
    """The experiment a list of CLI overrides names (``+experiment=NAME``), else ``default``."""
    return override_value(overrides, "+experiment", default)


def write(name: str, payload: dict[str, Any], path: Path | None = None) -> Path:
    """Writes ``benchmarks/results/<name>.json`` (or ``path``) with the command, the machine info and a
    timestamp.

    Paths are written relative to the repository (:func:`relative_paths`).
    """
    path = path or RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": command_line(),
        "machine": machine(),
        **payload,
    }
    path.write_text(json.dumps(relative_paths(payload), indent=2) + "\n")
    return path
