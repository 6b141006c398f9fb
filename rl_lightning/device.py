"""The device a run (or a command) uses, resolved once from the config's ``device`` (``auto``, ``cpu``,
``cuda``, ``cuda:N``)."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` -> the GPU when there is one, else the CPU; ``cuda`` without a GPU is an error."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device={device!r}: choose auto, cpu or cuda (or cuda:N).") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: choose auto, cpu or cuda (or cuda:N).")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device=cuda was asked for but CUDA is not available here; use device=auto or cpu.")
    return device
