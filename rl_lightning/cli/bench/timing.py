"""One bench variant in its own process: a real ``fit`` timed over its steady-state window."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from omegaconf import OmegaConf

from rl_lightning.cli.process import peak_rss_mb

__all__ = ["worker_main"]

_ACT_WARMUP = 5


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _SteadyStateProbe(L.Callback):
    """Opens the timing window at the first collection boundary past ``steady_start`` frames."""

    def __init__(self, steady_start: int, act_calls: int) -> None:
        self.steady_start = steady_start
        self.act_calls = act_calls
        self.fit_start = 0.0
        self.batches = 0
        self.opened: tuple[float, int, int] | None = None
        self.closed: tuple[float, int, int] | None = None
        self.act_ms: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.batches += 1
        dm = trainer.datamodule
        # owed_updates == 0: the round just done ended the updates owed, the next one collects first.
        if self.opened is None and dm.frames >= self.steady_start and dm.budget.owed == 0:
            _sync(pl_module.device)
            self.opened = (time.perf_counter(), dm.frames, dm.updates)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Still inside the fit: the callbacks' wrappers around the hot paths are in place.
        _sync(pl_module.device)
        self.closed = (time.perf_counter(), trainer.datamodule.frames, trainer.datamodule.updates)
        self.act_ms = self.time_act(pl_module, int(trainer.datamodule.env_cfg.num_envs))

    def time_act(self, module: L.LightningModule, num_envs: int) -> float:
        """Milliseconds per ``act`` call on fixed observations of the training envs' shape (``num_envs``
        envs; the module's observation spec is one env's)."""
        torch.manual_seed(0)
        template = module.observation_spec.rand().to(module.device)
        if num_envs != template.shape[0]:
            template = template.expand(num_envs, *template.shape[1:]).clone()
        if "step_count" in template.keys():
            template.get("step_count").fill_(1)  # mid-episode: the planner's warm start is used
        inputs = [template.clone() for _ in range(_ACT_WARMUP + self.act_calls)]
        with torch.no_grad():
            for td in inputs[:_ACT_WARMUP]:
                module.act(td)
            _sync(module.device)
            start = time.perf_counter()
            for td in inputs[_ACT_WARMUP:]:
                module.act(td)
            _sync(module.device)
        return (time.perf_counter() - start) / self.act_calls * 1e3

    def figures(self) -> dict[str, Any]:
        if self.opened is None or self.closed is None or self.closed[0] <= self.opened[0]:
            return {"status": "failed: no steady-state window (raise bench.frames)"}
        seconds = self.closed[0] - self.opened[0]
        return {
            "status": "ok",
            "env_fps": (self.closed[1] - self.opened[1]) / seconds,
            "updates_per_s": (self.closed[2] - self.opened[2]) / seconds,
            "act_ms": self.act_ms,
            "warmup_s": self.opened[0] - self.fit_start,
            "window": {
                "seconds": seconds,
                "frames": self.closed[1] - self.opened[1],
                "updates": self.closed[2] - self.opened[2],
                "start_frame": self.opened[1],
            },
        }


def worker_main() -> None:
    """One bench run in this process: ``python -c ... worker_main()`` SPEC_JSON (written by :func:`bench`)."""
    from rl_lightning.cli.process import quiet_libraries

    quiet_libraries()  # before the imports below load the libraries it quiets
    from rl_lightning.cli.run import build_run
    from rl_lightning.training.checkpoint import FrameCheckpoint
    from rl_lightning.training.evaluation import EvalCallback

    spec = json.loads(Path(sys.argv[1]).read_text())
    rss_start = peak_rss_mb()
    cfg = OmegaConf.create(spec["config"])
    run = build_run(cfg)
    cuda = run.trainer.strategy.root_device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    probe = _SteadyStateProbe(int(spec["steady_start"]), int(spec["act_calls"]))
    callbacks = run.trainer.callbacks
    callbacks[:] = [cb for cb in callbacks if not isinstance(cb, EvalCallback | FrameCheckpoint)] + [probe]
    run.trainer.fit(run.module, datamodule=run.datamodule)
    out = probe.figures()
    if cuda:
        out.update(peak_mem_mb=torch.cuda.max_memory_allocated() / 2**20, memory="CUDA max allocated")
    else:
        out.update(peak_mem_mb=peak_rss_mb() - rss_start, memory="RSS growth")
    out["callbacks"] = [type(cb).__name__ for cb in callbacks if cb is not probe]
    out["frames"] = run.datamodule.frames
    out["updates"] = run.datamodule.updates
    Path(spec["out"]).write_text(json.dumps(out, indent=1))
