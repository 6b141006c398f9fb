"""Shared helpers for the benchmark scripts: machine description and JSON output."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "load_avg_1m": os.getloadavg()[0],
    }
    for name in ("torchrl", "tensordict", "lightning", "gymnasium"):
        with contextlib.suppress(ImportError):
            info[name] = __import__(name).__version__
    return info


def write(name: str, payload: dict[str, Any]) -> Path:
    """Writes ``benchmarks/results/<name>.json`` with the machine info and a timestamp."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {"benchmark": name, "when": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine(), **payload}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
