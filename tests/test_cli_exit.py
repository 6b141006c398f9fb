"""The CLI process: it exits without the interpreter's teardown (after everything a normal exit does first),
and it answers `help` and config errors without loading torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

#: Runs ``python -m rl_lightning ARGV`` as ``-m`` would, after setting up what a normal exit must finish: a
#: non-daemon thread that writes only once the command has returned, an atexit handler, and output left in
#: stdout's buffer.
PROGRAM = """
import atexit, runpy, sys, threading, time
import rl_lightning.cli as cli
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
        timeout=120,
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
