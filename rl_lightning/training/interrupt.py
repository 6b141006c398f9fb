"""Ctrl-C and SIGTERM as a request to stop at the next safe point, not as an exception raised from anywhere.

A ``KeyboardInterrupt`` raised in arbitrary code can land inside a TensorDict context manager (TorchRL's
losses use ``params.to_module(...)``), a replay-buffer write or a checkpoint write, and turn into a crash
with nothing saved. Instead, while a fit runs, the first Ctrl-C only sets a flag: the experience stream
reads it (through its ``stop_request``) between collections and updates and ends the epoch (with several
ranks the decision is collective, so they all stop after the same update), an evaluation in progress stops
between env steps, and the checkpoint callback then writes ``last.ckpt`` with its replay buffer as at the
end of any run. A second Ctrl-C raises ``KeyboardInterrupt`` at once
(the periodic checkpoints, written atomically, are still there).

SIGTERM, what ``kill``, ``timeout``, ``docker stop`` and a cluster's scheduler send before they end a job,
gets the same graceful stop while the training loop runs. Lightning handles SIGTERM itself by raising
``SIGTERMException`` after the current batch, which ends the run without its final checkpoint and loses up to
``checkpoint.every_frames`` of progress; so this callback takes SIGTERM over from Lightning's handler (which
Lightning installs just before the loop starts) for the loop's duration. A second SIGTERM goes to
Lightning's handler: the run then ends after the current batch, without the final checkpoint.
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
    """Turns the first Ctrl-C (SIGINT) or SIGTERM of a ``fit`` into a graceful stop (see the module doc).

    Attributes:
        requested: True once a stop was requested (by Ctrl-C, SIGTERM or :meth:`request`).

    Example:
        ``Trainer(callbacks=[StopOnInterrupt(), ...])``; after ``fit``, ``stop.requested`` tells whether
        the run was interrupted.
    """

    def __init__(self, message: str = "stopping at the next safe point (Ctrl-C again to abort now)") -> None:
        self.message = message
        self.requested = False
        self._previous: Any = None
        self._installed = False
        self._previous_term: Any = None
        self._term_installed = False

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

    def _handle_term(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous_term
        if self.requested:
            # A second SIGTERM (or one after Ctrl-C): what Lightning does with SIGTERM.
            self._restore_term()
            if callable(previous):
                previous(signum, frame)
            return
        print(
            "SIGTERM: stopping at the next safe point (a second one ends the run without a final checkpoint)",
            file=sys.stderr,
            flush=True,
        )
        self.request()

    def _restore(self) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False

    def _restore_term(self) -> None:
        if self._term_installed:
            signal.signal(signal.SIGTERM, self._previous_term)
            self._term_installed = False

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
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning installed its SIGTERM handler just before the loop; it restores the one before it when
        # the trainer tears down, so ours is put back to Lightning's before that (at the loop's end).
        if threading.current_thread() is threading.main_thread() and not self._term_installed:
            self._previous_term = signal.signal(signal.SIGTERM, self._handle_term)
            self._term_installed = True

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore_term()

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    @override
    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore_term()
        self._restore()

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._restore()
