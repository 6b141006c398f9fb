"""Environment frames per second and updates per second, without a device sync."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from callbacks._logging import log_metrics, read_frames


class ThroughputMonitor(Callback):
    """Measure env frames/s and updates/s over windows of ``log_every_n_steps`` training batches.

    A training batch counts as one update, or as ``outputs["updates"]`` when ``training_step`` returns a
    mapping with that count (a step that runs several updates). Frames come from a duck-typed counter:
    ``trainer.datamodule.progress.frames`` (int, environment frames collected so far), else
    ``pl_module.frames``; without one, only updates/s is reported. At the end of each window the rates are
    the counter deltas over the ``time.perf_counter()`` delta. No CUDA synchronization: the host can run
    only a bounded queue of work ahead of the device (and any host read in the loop bounds it further), so
    over a window of tens of steps host-side rates equal device-side ones. Lightning's own
    ``ThroughputMonitor`` synchronizes the device every batch; this one is meant for the hot loop.

    The first window after ``on_train_start`` (also after a resume) is not reported: it holds compilation,
    CUDA-graph capture, allocator warm-up and the first collection. Time spent in validation is left out of
    the window.

    Metrics (logged against environment frames when known):
        ``time/env_sps``: environment frames per second (only with a frame counter).
        ``time/updates_per_s``: gradient updates per second.
        ``time/frames``: the frame counter at the end of the window (with ``log_frames``).

    The latest figures are also attributes, ``env_sps`` and ``updates_per_s`` (``None`` until the first
    reported window), for a progress bar.

    State: ``updates`` (total training batches seen) and the latest figures.

    Args:
        log_every_n_steps: training batches per measurement window (>= 1).
        log_frames: also log the frame counter as ``time/frames``.

    Example:
        >>> monitor = ThroughputMonitor(log_every_n_steps=100)
        >>> trainer = pl.Trainer(callbacks=[monitor])
    """

    def __init__(self, log_every_n_steps: int = 50, log_frames: bool = True) -> None:
        if (
            isinstance(log_every_n_steps, bool)
            or not isinstance(log_every_n_steps, int)
            or log_every_n_steps < 1
        ):
            raise ValueError(
                f"ThroughputMonitor: log_every_n_steps={log_every_n_steps!r} must be an int >= 1 "
                "(training batches per measurement window)."
            )
        if not isinstance(log_frames, bool):
            raise ValueError(f"ThroughputMonitor: log_frames={log_frames!r} must be True or False.")
        self.log_every_n_steps = log_every_n_steps
        self.log_frames = log_frames
        self.updates = 0
        self.env_sps: float | None = None
        self.updates_per_s: float | None = None
        self.windows = 0
        self._window_start = 0.0
        self._window_updates = 0
        self._window_frames: int | None = None
        self._frames_since = 0.0
        self._paused_at: float | None = None

    def _open_window(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._window_start = time.perf_counter()
        self._window_updates = self.updates
        frames = read_frames(trainer)
        # Frames arrive in bursts (one collection, then many updates): the frame rate is measured between
        # windows in which the frame count moved, so an update-only window does not read as 0 frames/s.
        if self._window_frames is None or frames != self._window_frames:
            self._window_frames = frames
            self._frames_since = self._window_start

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.windows = 0
        self._paused_at = None
        self._open_window(trainer, pl_module)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        done = outputs.get("updates", 1) if isinstance(outputs, dict) else 1
        self.updates += int(done) if isinstance(done, int) else 1
        updates = self.updates - self._window_updates
        if updates < self.log_every_n_steps:
            return
        now = time.perf_counter()
        elapsed = now - self._window_start
        frames_elapsed = now - self._frames_since
        frames = read_frames(trainer)
        start_frames = self._window_frames
        self.windows += 1
        self._open_window(trainer, pl_module)
        if self.windows == 1 or elapsed <= 0:
            return
        self.updates_per_s = updates / elapsed
        metrics = {"time/updates_per_s": self.updates_per_s}
        if frames is not None and start_frames is not None and frames != start_frames and frames_elapsed > 0:
            self.env_sps = (frames - start_frames) / frames_elapsed
            metrics["time/env_sps"] = self.env_sps
        if frames is not None and self.log_frames:
            metrics["time/frames"] = float(frames)
        log_metrics(trainer, metrics)

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._paused_at = time.perf_counter()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._paused_at is not None:
            paused = time.perf_counter() - self._paused_at
            self._window_start += paused
            self._frames_since += paused
            self._paused_at = None

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"updates": self.updates, "env_sps": self.env_sps, "updates_per_s": self.updates_per_s}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.updates = int(state_dict.get("updates", 0))
        self.env_sps = state_dict.get("env_sps")
        self.updates_per_s = state_dict.get("updates_per_s")
