"""Ctrl-C as a request to stop at the next safe point, not as an exception raised from anywhere.

A ``KeyboardInterrupt`` raised in arbitrary code can land inside a TensorDict context manager (TorchRL's
losses use ``params.to_module(...)``), a replay-buffer write or a checkpoint write, and turn into a crash
with nothing saved. Instead, while a fit runs, the first Ctrl-C only sets a flag: the experience stream
reads it (through its ``stop_request``) between collections and updates and ends the epoch (with several
ranks the decision is collective, so they all stop after the same update), an evaluation in progress stops
between env steps, and the checkpoint callback then writes ``last.ckpt`` with its replay buffer as at the
end of any run. A second Ctrl-C raises ``KeyboardInterrupt`` at once
(the periodic checkpoints, written atomically, are still there).
"""

from __future__ import annotations

import signal
import sys
import threading
from types import FrameType
from typing import Any

import lightning as L
from typing_extensions import override

__all__ = ["StopOnInterrupt"]


class StopOnInterrupt(L.Callback):
    """Turns the first Ctrl-C (SIGINT) during ``fit`` into a graceful stop (see the module docstring).

    Attributes:
        requested: True once a stop was requested (by Ctrl-C or :meth:`request`).

    Example:
        ``Trainer(callbacks=[StopOnInterrupt(), ...])``; after ``fit``, ``stop.requested`` tells whether
        the run was interrupted.
    """

    def __init__(self, message: str = "stopping at the next safe point (Ctrl-C again to abort now)") -> None:
        self.message = message
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def request(self) -> None:
        """Asks the run to stop at its next safe point (what the first Ctrl-C does).

        It does not set ``trainer.should_stop`` itself: a rank that ended its epoch alone would leave the
        others waiting in their next collective.
        """
        self.requested = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            # A second Ctrl-C: the user means it.
            self._restore()
            raise KeyboardInterrupt
        print(self.message, file=sys.stderr, flush=True)
        self.request()

    def _restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.requested = False
        # Signal handlers can only be set from the main thread; elsewhere Ctrl-C keeps its default. A process
        # that ignores Ctrl-C (started with nohup or `&` from a script) keeps ignoring it.
        main_thread = threading.current_thread() is threading.main_thread()
        if main_thread and not self._installed and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()
