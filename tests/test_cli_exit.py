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


#: Counts the collector's passes until the command's libraries are imported (``end_import_pause``), and
#: reads the collector's state at exit.
GC_PROGRAM = """
import atexit, gc, runpy, sys
import rl_lightning.cli as cli
passes = []
gc.callbacks.append(lambda phase, info: phase == "stop" and passes.append(info["generation"]))
real_end = cli.end_import_pause
def end_import_pause():
    if "imported" not in passes:
        print("passes while importing:", len(passes), "torch loaded:", "torch" in sys.modules)
        passes.append("imported")
    real_end()
cli.end_import_pause = end_import_pause
atexit.register(lambda: print("at exit: enabled", gc.isenabled(), "frozen", gc.get_freeze_count()))
sys.argv = ["rl_lightning", *sys.argv[1:]]
runpy.run_module("rl_lightning", run_name="__main__", alter_sys=True)
"""


def test_the_cli_imports_without_collector_passes_and_freezes_what_it_imported(tmp_path: Path) -> None:
    # A command that imports torch and Lightning (evaluate), then stops with a user error.
    proc = subprocess.run(
        [sys.executable, "-c", GC_PROGRAM, "evaluate", f"ckpt={tmp_path / 'none.ckpt'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == "passes while importing: 0 torch loaded: True"
    enabled, frozen = lines[-1].removeprefix("at exit: enabled ").split(" frozen ")
    assert enabled == "True"
    assert int(frozen) > 100_000  # torch, Lightning and TorchRL's modules, classes and functions


def test_main_in_process_leaves_the_collector_as_it_was(tmp_path: Path, monkeypatch) -> None:
    import gc

    from rl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    frozen = gc.get_freeze_count()
    assert gc.isenabled()
    assert main(["evaluate", f"ckpt={tmp_path / 'none.ckpt'}"]) == 2
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
