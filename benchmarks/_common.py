"""Shared helpers for the benchmark scripts: machine description and JSON output."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

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


def write(name: str, payload: dict[str, Any]) -> Path:
    """Writes ``benchmarks/results/<name>.json`` with the machine info and a timestamp."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
