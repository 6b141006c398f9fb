"""Process settings of a command (``flush_denormal``, torch threads) and its peak memory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rl_lightning.cli import main
from rl_lightning.cli.process import (
    apply_process_settings,
    flushes_denormals,
    peak_rss_mb,
    restore_process_settings,
)

#: The smallest subnormal float32 times four: Adam's ``0.9 * m`` rounds back to it.
STUCK = 4 * 2.0**-149


@pytest.fixture(autouse=True)
def _put_back():
    # Before as after: a test that built a run in this worker without `main` (build_run applies the
    # settings, main puts them back) may have left subnormal flushing on.
    restore_process_settings()
    torch.set_flush_denormal(False)
    yield
    restore_process_settings()
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("flush", [True, False])
def test_apply_sets_the_mode_and_restore_puts_back_what_it_found(flush: bool) -> None:
    assert not flushes_denormals()
    threads = torch.get_num_threads()
    apply_process_settings(OmegaConf.create({"torch_threads": threads + 1, "flush_denormal": flush}))
    assert flushes_denormals() is flush
    assert torch.get_num_threads() == threads + 1
    assert torch.tensor([STUCK]).mul(1.0).item() == (0.0 if flush else STUCK)
    restore_process_settings()
    assert not flushes_denormals()
    assert torch.get_num_threads() == threads


def test_main_in_process_leaves_the_float_mode_as_it_was(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # evaluate applies the process settings (flush_denormal is on by default), then finds no checkpoint
    assert main(["evaluate", f"ckpt={tmp_path / 'none.ckpt'}"]) == 2
    assert not flushes_denormals()


def test_bad_value_is_one_line_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["fit", "+experiment=dqn_cartpole", "flush_denormal=maybe"]) == 2
    assert capsys.readouterr().err.strip() == "error: flush_denormal='maybe': expected true or false."


def _adam(flush: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """20 steps of a fused Adam whose idle half (zero gradients) has first moments stuck at ``STUCK``."""
    weight = torch.nn.Parameter(torch.linspace(-1.0, 1.0, 512))
    opt = torch.optim.Adam([weight], lr=1e-3, fused=True)
    weight.grad = torch.cat([torch.linspace(-0.1, 0.1, 256), torch.zeros(256)])
    opt.step()  # makes the state
    state = opt.state[weight]
    state["exp_avg"][256:] = STUCK
    state["exp_avg_sq"][256:] = 1e-10
    assert (state["exp_avg"][256:] == STUCK).all()
    torch.set_flush_denormal(flush)
    try:
        for _ in range(20):
            opt.step()
    finally:
        torch.set_flush_denormal(False)
    return weight.detach().clone(), state["exp_avg"].clone(), state["exp_avg_sq"].clone()


def test_flushing_zeroes_stuck_adam_moments_and_leaves_the_weights_bit_for_bit() -> None:
    kept_weight, kept_m, _ = _adam(False)
    flushed_weight, flushed_m, flushed_v = _adam(True)
    assert (kept_m[256:] == STUCK).all()  # without flushing, 0.9 * m never leaves the subnormal range
    assert (flushed_m[256:] == 0).all()
    assert torch.equal(kept_weight, flushed_weight)  # what the stuck moments added was lost in rounding
    assert torch.equal(kept_m[:256], flushed_m[:256]) and (flushed_v > 0).all()


@pytest.mark.parametrize("pool_first", [False, True])
@pytest.mark.slow
def test_intra_op_threads_started_after_the_settings_flush_too(pool_first: bool) -> None:
    """The mode belongs to each thread: set before the run's first parallel op, torch's workers inherit it;
    workers started before keep subnormals (the control case)."""
    program = (
        "import torch\n"
        "from omegaconf import OmegaConf\n"
        "from rl_lightning.cli.process import apply_process_settings\n"
        "torch.set_num_threads(2)\n"
        f"if {pool_first}: torch.ones(1 << 22).mul(2.0)\n"  # a parallel op starts the workers
        "apply_process_settings(OmegaConf.create({'torch_threads': 2, 'flush_denormal': True}))\n"
        "x = torch.full((1 << 22,), 4, dtype=torch.int32).view(torch.float32)\n"  # subnormals, no float op
        "print(int((x.mul(1.0) != 0).sum()))\n"  # one parallel op over both threads
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert (int(out.stdout) > 0) is pool_first


def test_a_started_process_reports_its_own_peak_memory_not_its_parents() -> None:
    """A bench variant is a process started from the command's: its peak must not be the parent's size
    (``ru_maxrss`` carries that over the fork on Linux)."""
    ballast = bytearray(512 * 2**20)
    ballast[::4096] = b"\x01" * len(ballast[::4096])  # resident: every page written
    code = "from rl_lightning.cli.process import peak_rss_mb; print(peak_rss_mb())"
    child = float(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert 0 < child < 256  # the interpreter and OmegaConf: tens of MiB
    assert peak_rss_mb() > 512
    del ballast
