"""The CLI process: it exits without the interpreter's teardown (after everything a normal exit does first),
and it answers `help` and config errors without loading torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Runs ``python -m rl_lightning ARGV`` as ``-m`` would, after setting up what a normal exit must finish: a
#: non-daemon thread that writes only once the command has returned, a thread pool with an idle worker
#: (torch's compiler starts such pools; its workers end only when threading's exit callbacks wake them), an
#: atexit handler, and output left in stdout's buffer.
PROGRAM = """
import atexit, runpy, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import rl_lightning.cli as cli
pool = ThreadPoolExecutor(1)
pool.submit(int).result()
out = sys.argv[1]
main_returned = threading.Event()
def late_writer():
    main_returned.wait()
    time.sleep(0.3)
    with open(out, "a") as f:
        f.write("thread ")
def main(*args, **kwargs):
    try:
        return real_main(*args, **kwargs)
    finally:
        main_returned.set()
real_main, cli.main = cli.main, main
threading.Thread(target=late_writer).start()
atexit.register(lambda: open(out, "a").write("atexit "))
sys.stdout.write("buffered, no newline")
sys.argv = ["rl_lightning", *sys.argv[2:]]
runpy.run_module("rl_lightning", run_name="__main__", alter_sys=True)
"""


def _run(tmp_path: Path, *argv: str, teardown: bool = False) -> tuple[subprocess.CompletedProcess, str]:
    out = tmp_path / "finished.txt"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("RL_LIGHTNING_TEARDOWN", None)
    env.pop("PYTHONUNBUFFERED", None)  # stdout to a pipe is then block-buffered: the exit must flush it
    if teardown:
        env["RL_LIGHTNING_TEARDOWN"] = "1"
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(out), *argv],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    return proc, out.read_text() if out.exists() else ""


@pytest.mark.parametrize("teardown", [False, True], ids=["fast-exit", "teardown"])
@pytest.mark.parametrize(
    ("argv", "code"), [(("help",), 0), (("fit", "+experiment=no_such"), 2)], ids=["ok", "error"]
)
def test_exit_joins_threads_runs_atexit_flushes_output_and_keeps_the_code(
    tmp_path: Path, argv: tuple[str, ...], code: int, teardown: bool
) -> None:
    proc, finished = _run(tmp_path, *argv, teardown=teardown)
    assert proc.returncode == code, proc.stderr
    # The thread finished its write before the atexit handler ran, as in the interpreter's own exit.
    assert finished == "thread atexit "
    assert proc.stdout.startswith("buffered, no newline")
    if code:
        assert proc.stderr.strip().splitlines()[-1].startswith("error: ")
    else:
        assert "fit" in proc.stdout


@pytest.mark.parametrize("teardown", [False, True], ids=["fast-exit", "teardown"])
def test_output_to_a_pipe_nobody_reads_ends_without_a_traceback(tmp_path: Path, teardown: bool) -> None:
    """`python -m rl_lightning help | head -1`: the reader is gone before the output is written. The write
    fails in the command (exit 141, as after SIGPIPE) or in the flush at exit (exit 0): never a traceback,
    nor the interpreter's "Exception ignored" on its own last flush."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    env.pop("RL_LIGHTNING_TEARDOWN", None)
    if teardown:
        env["RL_LIGHTNING_TEARDOWN"] = "1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rl_lightning", "help"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    proc.stdout.close()  # before the interpreter has even started
    err = proc.stderr.read()
    assert proc.wait(timeout=60) in (0, 141), err
    assert "Traceback" not in err and "Exception ignored" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize(
    "argv",
    [("help",), ("fit",), ("fit", "+experiment=no_such"), ("fit", "+experiment=dqn_cartpole", "env=cartpol")],
)
def test_help_and_config_errors_answer_without_loading_torch(tmp_path: Path, argv: tuple[str, ...]) -> None:
    # Whether torch was imported is read at exit (atexit), once the command has answered.
    program = (
        "import atexit, runpy, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules))\n"
        "sys.argv = ['rl_lightning', *sys.argv[1:]]\n"
        "runpy.run_module('rl_lightning', run_name='__main__', alter_sys=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == (0 if argv == ("help",) else 2), proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "torch loaded: False"


#: Counts the collector's passes until the command's start-up ends (``end_startup_pause``), says which
#: libraries were loaded by then, and reads the collector's state at exit.
GC_PROGRAM = """
import atexit, gc, runpy, sys
import rl_lightning.cli as cli
import rl_lightning.cli.process as process
passes = []
gc.callbacks.append(lambda phase, info: phase == "stop" and passes.append(info["generation"]))
real_end = process.end_startup_pause
def end_startup_pause():
    if "started" not in passes:
        loaded = [m for m in ("torch", "mlflow", "sqlalchemy") if m in sys.modules]
        print("passes while starting up:", len(passes), "loaded:", *loaded)
        passes.append("started")
    real_end()
cli.end_startup_pause = process.end_startup_pause = end_startup_pause  # fit imports it from process later
atexit.register(lambda: print("at exit: enabled", gc.isenabled(), "frozen", gc.get_freeze_count()))
sys.argv = ["rl_lightning", *sys.argv[1:]]
runpy.run_module("rl_lightning", run_name="__main__", alter_sys=True)
"""


def _gc_program(tmp_path: Path, *argv: str) -> tuple[subprocess.CompletedProcess, str, int]:
    """Runs ``python -m rl_lightning *argv`` under ``GC_PROGRAM``: the process, its start-up line and the
    number of objects frozen at exit (after checking that the collector was on again)."""
    proc = subprocess.run(
        [sys.executable, "-c", GC_PROGRAM, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("at exit: enabled "), proc.stderr
    enabled, frozen = lines[-1].removeprefix("at exit: enabled ").split(" frozen ")
    assert enabled == "True"
    started = [line for line in lines if line.startswith("passes while starting up:")]
    assert len(started) == 1, proc.stdout
    return proc, started[0], int(frozen)


@pytest.mark.slow
def test_the_cli_imports_without_collector_passes_and_freezes_what_it_imported(tmp_path: Path) -> None:
    # A command that imports torch and Lightning (evaluate), then stops with a user error.
    proc, started, frozen = _gc_program(tmp_path, "evaluate", f"ckpt={tmp_path / 'none.ckpt'}")
    assert proc.returncode == 2, proc.stderr
    assert started == "passes while starting up: 0 loaded: torch"
    assert frozen > 100_000  # torch, Lightning and TorchRL's modules, classes and functions


@pytest.mark.slow
def test_fit_starts_up_without_collector_passes_until_its_run_is_built(tmp_path: Path) -> None:
    # The run's MLflow logger (the default) opens its SQLite store while building the run: MLflow and
    # SQLAlchemy are imported then, and frozen with the rest when training starts.
    proc, started, frozen = _gc_program(
        tmp_path, "fit", "+experiment=dqn_cartpole", "total_frames=200", "progress_bar=false", "device=cpu"
    )
    assert proc.returncode == 0, proc.stderr
    assert started == "passes while starting up: 0 loaded: torch mlflow sqlalchemy"
    assert frozen > 100_000


def test_main_in_process_leaves_the_collector_as_it_was(tmp_path: Path, monkeypatch) -> None:
    import gc

    from rl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    assert main(["evaluate", f"ckpt={tmp_path / 'none.ckpt'}"]) == 2
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
