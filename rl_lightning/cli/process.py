"""Process-wide settings of a command: they belong to the CLI, never to library code."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from omegaconf import DictConfig

__all__ = [
    "apply_process_settings",
    "end_startup_pause",
    "exit_process",
    "flushes_denormals",
    "pause_gc_for_startup",
    "quiet_libraries",
    "restore_process_settings",
    "stop_when_output_closes",
]


#: Messages that every run printed and that say nothing the user can act on.
_HARMLESS = (
    "litlogger",  # an advert
    "not found. Creating it",  # MLflow's first run in a store creates the experiment
    "no CUDA device; nothing to clear",  # the default cache-clearing callback on a CPU
    "GPU available:",  # Lightning's description of the machine, which `fit` states in its first line
    "TPU available:",
    "HPU available:",
    "`Trainer.fit` stopped:",  # the frame budget ends a run, not max_epochs
)


#: The loggers those messages come through (Lightning's rank-zero helpers serve our callbacks too).
_FILTERED = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.loggers.mlflow")


class _DropHarmless(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in _HARMLESS)


def quiet_libraries() -> Callable[[], None]:
    """Keeps the console to what matters for a run.

    Returns:
        A function that removes the log filters again (``main`` calls it on the way out, so that a
        command run in-process, from a test or a notebook, leaves the process's logging as it found it).
    """
    # Both libraries read these when first imported, so they are set before any import of them.
    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("RL_WARNINGS", "False")
    # Rendering for videos needs no display; without these SDL complains on every video.
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    for name in ("torchrl", "mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    harmless = _DropHarmless()
    loggers = [logging.getLogger(name) for name in _FILTERED]
    for logger in loggers:
        logger.addFilter(harmless)

    def undo() -> None:
        for logger in loggers:
            logger.removeFilter(harmless)

    return undo


class _OutputGuard:
    """A standard stream whose reader may go away: the first ``BrokenPipeError`` calls ``on_closed`` and
    from then on output goes nowhere. Everything else is the wrapped stream's."""

    def __init__(self, stream: Any, on_closed: Callable[[], None]) -> None:
        self._stream = stream
        self._on_closed = on_closed
        self.reader_gone = False

    def write(self, text: str) -> int:
        if not self.reader_gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._gone()
        return len(text)

    def flush(self) -> None:
        if not self.reader_gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._gone()

    def _gone(self) -> None:
        self.reader_gone = True
        # What is left in the stream's buffer is flushed at exit: to /dev/null, not into the closed pipe.
        _point_at_devnull(self._stream)
        self._on_closed()


def _point_at_devnull(stream: Any) -> None:
    """Gives ``stream``'s file descriptor to /dev/null (nothing for a stream without one)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, stream.fileno())
        finally:
            os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def stop_when_output_closes(request_stop: Callable[[], None]) -> Iterator[None]:
    """While a run trains, a closed stdout or stderr (its reader went away: ``| head``, ``| tee`` ended with
    Ctrl-C, a parent process that started the run and ended) stops the run at its next safe point, with its
    checkpoint, instead of a ``BrokenPipeError`` raised from whatever printed, which ended the run as FAILED
    without one. The rest of the run's output is dropped.

    Args:
        request_stop: asks the run to stop (``StopOnInterrupt.request``).
    """
    found = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = (None if s is None else _OutputGuard(s, request_stop) for s in found)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = found


#: What :func:`apply_process_settings` found before it changed it, for :func:`restore_process_settings`.
_found: dict[str, Any] = {}


def flushes_denormals() -> bool:
    """Whether this thread's CPU math takes subnormal floats as zero (``torch.set_flush_denormal``).

    torch has no getter: a subnormal float32 times one is zero only when the flag is on.
    """
    import torch

    return bool(torch.tensor([1e-39], dtype=torch.float32).mul(1.0)[0] == 0)


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (``bench`` reports its growth over a run).

    On Linux it is the address space's own high-water mark (``VmHWM``): ``ru_maxrss`` carries over the
    parent's resident memory at the fork that started this process, so a variant started from a large
    process (``bench`` run from a notebook or a test) would report the parent's size as its peak.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**10  # kB
    except OSError:
        pass
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def apply_process_settings(cfg: DictConfig) -> None:
    """Torch threads (``torch_threads``) and subnormal flushing (``flush_denormal``) for this process.

    ``flush_denormal`` sets the CPU's flush-to-zero and denormals-are-zero modes (x86 with SSE3, ARM64;
    elsewhere ``torch.set_flush_denormal`` does nothing). Subnormal floats are those below 1.2e-38 in
    float32. Adam's moment estimates of a ReLU unit that stopped firing decay into that range and stay
    there: ``0.9 * m`` rounds back to ``m`` for the smallest subnormals, so they never reach zero, and
    every multiply, square root and division on a subnormal operand takes the CPU's slow path. Flushed,
    they are zero, and what they would have added to a weight (below 1e-38 times the learning rate) was
    lost in rounding anyway.

    The mode belongs to each thread, and threads inherit it when they are started: it is set here, in
    the command's thread, before the run's first torch op starts torch's intra-op worker threads.
    """
    import torch  # here, not at the top: `help` and config errors answer without loading torch (1 s)

    threads = cfg.get("torch_threads")
    if threads is not None:
        if int(threads) < 1:
            raise ValueError("torch_threads must be >= 1 or null (torch's default).")
        _found.setdefault("torch_threads", torch.get_num_threads())
        torch.set_num_threads(int(threads))
    flush = cfg.get("flush_denormal")
    if flush is not None:
        _found.setdefault("flush_denormal", flushes_denormals())
        torch.set_flush_denormal(bool(flush))


def restore_process_settings() -> None:
    """Puts back what :func:`apply_process_settings` changed (``main`` calls it on the way out, so that a
    command run in-process, from a test or a notebook, leaves torch's threads and float modes as it found
    them). Does nothing when nothing was changed."""
    if not _found:
        return
    import torch

    if "torch_threads" in _found:
        torch.set_num_threads(_found.pop("torch_threads"))
    if "flush_denormal" in _found:
        torch.set_flush_denormal(_found.pop("flush_denormal"))


#: Whether ``pause_gc_for_startup`` turned the collector off (``end_startup_pause`` turns it back on).
_gc_paused = False


def pause_gc_for_startup() -> None:
    """Turns Python's cyclic garbage collector off while the command starts up.

    ``python -m rl_lightning`` calls it before anything is imported; :func:`end_startup_pause` ends it
    once the command's start-up is over: ``main`` calls it when the command's module is imported, ``fit``
    once its run is built (the config, the networks, the envs and the MLflow logger, whose store imports
    MLflow and SQLAlchemy), right before training. Importing torch, Lightning, TorchRL and their
    dependencies makes about 650k objects, and the collector's full passes over that growing heap (one
    whenever a quarter of it is new) took 1.2 s of every fit's start-up: 9 passes, the last one 0.33 s.
    The objects are modules, classes, functions and the run's parts, which live as long as the process,
    so there is nothing to collect among them. Not used when ``main`` runs in-process (tests, notebooks):
    the collector is then left as it is.
    """
    global _gc_paused
    if gc.isenabled():
        gc.disable()
        _gc_paused = True


def end_startup_pause() -> None:
    """Ends :func:`pause_gc_for_startup`: what the start-up made is moved out of the collector's reach
    (``gc.freeze``), so that later full passes do not walk it again, and collection resumes for everything
    made from now on. Ended after the imports only, a CartPole DQN fit's passes still walked the 235k
    objects that building its run made (MLflow and SQLAlchemy's modules above all): 0.9 s of full passes
    during a 50k-frame run, 0.02 s once the run is frozen with them. Does nothing when the collector was
    not paused, or was already resumed."""
    global _gc_paused
    if _gc_paused:
        gc.freeze()
        gc.enable()
        _gc_paused = False


def exit_process(code: int) -> None:
    """Ends the command's process with ``code`` the way the interpreter would, less its teardown.

    What a normal exit does that matters is done first, in the interpreter's own order: threading's
    shutdown tells the idle workers of thread pools to end (``concurrent.futures``, which torch's compiler
    uses, registers that with ``threading``, not ``atexit``) and joins the threads that are not daemons,
    then the ``atexit`` handlers run (multiprocessing's joins worker processes,
    ``weakref.finalize`` removes temporary directories, logging flushes its files), and stdout and stderr
    are flushed. The teardown that would follow frees every module and object one by one, which takes
    1-2 s once torch, Lightning and MLflow are imported; ``os._exit`` skips it. The project writes its
    files inside ``with`` blocks, so no buffer waits for a finalizer. Set ``RL_LIGHTNING_TEARDOWN=1`` to
    exit through the teardown all the same (``sys.exit``), as where the interpreter lacks those steps
    (``rl_lightning.compat.HAS_EXIT_STEPS``) or torch was never loaded.
    """
    if os.environ.get("RL_LIGHTNING_TEARDOWN") or "torch" not in sys.modules:
        # Without torch loaded (help, a config error) the teardown is short, and the compat layer would
        # load torch only to skip it.
        _flush_standard_streams()
        sys.exit(code)
    from rl_lightning import compat

    if not compat.HAS_EXIT_STEPS:
        _flush_standard_streams()
        sys.exit(code)
    # The interpreter's own first step at exit: joining the non-daemon threads alone would wait forever for
    # a thread pool's idle workers, which end only when threading's exit callbacks wake them.
    compat.run_exit_steps()
    _flush_standard_streams()
    os._exit(code)


def _flush_standard_streams() -> None:
    """Flushes stdout and stderr. One whose reader went away (a closed pipe: ``| head``, a parent that
    ended) gets /dev/null as its file descriptor, Python's recipe for SIGPIPE: the interpreter's own flush
    at exit then has somewhere to write and does not print an ignored ``BrokenPipeError``."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            _point_at_devnull(stream)
        except (OSError, ValueError):  # a closed stream: nothing left to write to
            pass
