"""``python -m rl_lightning export ckpt=PATH [format=torchscript|onnx] [out=PATH]``: a standalone policy.

The checkpoint is loaded safely and its algorithm's deterministic policy (``RLModule.export_policy``, the
same actions as ``act_eval``) is written as a file that runs without this framework:

- ``torchscript``: ``policy = torch.jit.load(PATH); action = policy(observation)``;
- ``onnx`` (the ``export`` extra: ``pip install rl_lightning[export]``):
  ``onnxruntime.InferenceSession(PATH).run(None, {"observation": obs})[0]``.

``observation`` is a float32 array ``[N, *obs_shape]``; the batch size is dynamic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from rl_lightning.cli.config import CliError
from rl_lightning.cli.process import apply_process_settings
from rl_lightning.cli.run import check_env_imports, restore_module
from rl_lightning.training.safe_load import CONFIG_KEY, load_checkpoint

__all__ = ["FORMATS", "export", "export_module"]

FORMATS = {"torchscript": ".pt", "onnx": ".onnx"}


def export_module(policy: torch.nn.Module, example: torch.Tensor, fmt: str, out: Path) -> None:
    """Writes ``policy`` (``observation -> action``) traced on ``example`` as ``fmt`` to ``out``."""
    policy = policy.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        if fmt == "torchscript":
            traced = torch.jit.trace(policy, example, check_trace=True)
            torch.jit.save(traced, str(out))
            return
        try:
            import onnx  # noqa: F401  (the exporter needs it)
        except ImportError:
            message = "export.format=onnx needs the onnx package: pip install 'rl_lightning[export]'."
            raise CliError(message) from None
        torch.onnx.export(
            policy,
            (example,),
            str(out),
            input_names=["observation"],
            output_names=["action"],
            dynamic_axes={"observation": {0: "batch"}, "action": {0: "batch"}},
            dynamo=False,
        )


def export(cfg: DictConfig) -> dict[str, Any]:
    """Exports the deterministic policy of ``cfg.ckpt`` (see the module docstring)."""
    if cfg.ckpt is None:
        raise CliError("export needs ckpt=PATH (a checkpoint written by fit).")
    fmt = str(cfg.export.format)
    if fmt not in FORMATS:
        raise CliError(f"export.format={fmt!r}: choose one of {', '.join(FORMATS)}.")
    apply_process_settings(cfg)
    ckpt = load_checkpoint(cfg.ckpt)
    saved = OmegaConf.create(ckpt[CONFIG_KEY]["config"])
    check_env_imports(saved, cfg)
    module = restore_module(ckpt, saved)
    try:
        policy = module.export_policy()
    except NotImplementedError as e:
        raise CliError(str(e)) from None
    out = Path(cfg.export.out) if cfg.export.out else Path(cfg.ckpt).with_suffix(FORMATS[fmt])
    example = module.observation_spec["observation"].zero()[:1].float()
    export_module(policy, example, fmt, out)
    info = {"out": str(out), "format": fmt, "observation_shape": list(example.shape[1:]), "algo": saved.name}
    print(f"exported {type(module).__name__}'s deterministic policy to {out} ({fmt})")
    print(json.dumps(info))
    return info
