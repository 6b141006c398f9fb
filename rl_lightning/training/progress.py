"""One progress bar in environment frames, with evaluation results printed above it."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from typing_extensions import override

from rl_lightning.compat import attached_trainer

__all__ = ["FramesProgressBar"]


class FramesProgressBar(ProgressBar):
    """A rich bar counted in environment frames that ends exactly at ``total_frames``.

    It shows frames done / total, the time remaining, one rate (env frames per second over the last
    ``rate_window_s`` seconds) and a postfix with the mean return of the last training episodes, the last
    evaluation's mean return and the number of updates (which also moves while a warm-up burst of updates
    runs without collecting). Lightning's bar counts batches, which here are updates of unknown number;
    this one reads the data path's progress view (``trainer.datamodule.progress``: host integers, no device
    sync). Evaluation results
    and other messages go through :meth:`print`, which writes them on their own lines above the bar.

    Without a terminal (a script, CI, output to a file) a bar would be redrawn into the log and cut at the
    width of no screen: there the same figures are one plain line every ``plain_every_s`` seconds, and at
    the end.

    Args:
        refresh_every_s: minimum seconds between redraws (redrawing costs more than a CartPole step).
        rate_window_s: the window of the frames/s figure and of the time remaining.
        plain_every_s: seconds between the plain lines written without a terminal.
    """

    def __init__(
        self, refresh_every_s: float = 0.25, rate_window_s: float = 30.0, plain_every_s: float = 10.0
    ) -> None:
        super().__init__()
        if refresh_every_s <= 0 or rate_window_s <= 0 or plain_every_s <= 0:
            raise ValueError("refresh_every_s, rate_window_s and progress_every_s must be > 0.")
        self.refresh_every_s = refresh_every_s
        self.rate_window_s = rate_window_s
        self.plain_every_s = plain_every_s
        self._plain = False
        self._enabled = True
        self._progress: Progress | None = None
        self._task: Any = None
        self._last_draw = 0.0
        self._samples: deque[tuple[float, int]] = deque()
        self._start: tuple[float, int] | None = None  # (time, frames) when a plain-text run began

    # ------------------------------------------------------------------ ProgressBar API
    @property
    def is_enabled(self) -> bool:
        trainer = attached_trainer(self)
        return self._enabled and (trainer is None or trainer.is_global_zero)

    @override
    def disable(self) -> None:
        self._enabled = False

    @override
    def enable(self) -> None:
        self._enabled = True

    @override
    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._progress is not None:
            self._progress.console.print(*args, **kwargs)
        else:
            print(*args, **kwargs)

    # ------------------------------------------------------------------ drawing
    def _rate(self, now: float, frames: int) -> float | None:
        self._samples.append((now, frames))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.rate_window_s:
            self._samples.popleft()
        t0, f0 = self._samples[0]
        return (frames - f0) / (now - t0) if now > t0 and frames > f0 else None

    def _draw(self, trainer: L.Trainer, force: bool = False) -> None:
        now = time.perf_counter()
        every = self.plain_every_s if self._plain else self.refresh_every_s
        if not (self._plain or self._progress is not None) or (not force and now - self._last_draw < every):
            return
        self._last_draw = now
        progress = trainer.datamodule.progress
        total = progress.total_frames
        frames = min(progress.frames, total)
        rate = self._rate(now, frames)
        post = []
        recent = progress.recent_returns
        if recent:
            post.append(f"return {sum(recent) / len(recent):.1f}")
        ev = trainer.callback_metrics.get("eval/return_mean")
        if ev is not None:
            post.append(f"eval {float(ev):.1f}")
        post.append(f"updates {progress.updates}")
        description = "warm-up" if progress.in_warmup else "frames"
        if self._plain and force and self._start is not None:  # the last line: the whole run's figures
            t0, f0 = self._start
            rate = (frames - f0) / (now - t0) if now > t0 and frames > f0 else rate
        rate_text = f"{rate:,.0f} frames/s" if rate is not None else "- frames/s"
        if self._plain:
            left = f"{(total - frames) / rate:,.0f} s left" if rate else "- s left"
            if force and self._start is not None:
                left = f"done in {now - self._start[0]:,.0f} s"
            line = f"{description} {frames}/{total} ({frames / total:.0%}) · {rate_text} · {left}"
            print(" · ".join([line, *post]), flush=True)
            return
        self._progress.update(
            self._task, completed=frames, description=description, rate=rate_text, post=" · ".join(post)
        )

    def _stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # ------------------------------------------------------------------ hooks
    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.is_enabled:
            return
        progress = trainer.datamodule.progress
        self._samples.clear()
        console = Console()
        self._plain = not console.is_terminal
        if self._plain:
            self._last_draw = time.perf_counter()
            self._start = (self._last_draw, progress.frames)
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[post]}"),
            console=console,
            speed_estimate_period=self.rate_window_s,
        )
        self._progress.start()
        self._task = self._progress.add_task(
            "frames", total=progress.total_frames, completed=progress.frames, rate="- frames/s", post=""
        )

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self._draw(trainer)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.is_enabled:
            self._draw(trainer, force=True)
        self._stop()

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._stop()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._stop()
