"""Every host/device copy of the data path goes through one switch, and ``non_blocking`` acts on it.

On the CPU the copies are counted: a real fit routes the observations, the collected frames, the replay
samples and new priorities through :class:`~rl_lightning.data.transfer.DeviceCopies`, and the
``NonBlockingTransfer`` callback turns the switch on and off again through the data module's progress
view. On a GPU (``gpu``): a replay in host memory feeding a module on the device, with ``non_blocking`` the
sample copies come from pinned memory and never wait for the device, and the run's results equal the
blocking run's.
"""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from tensordict import TensorDict

from callbacks import NonBlockingTransfer
from rl_lightning.cli import compose
from rl_lightning.cli.run import Run, build_run
from rl_lightning.data.budget import FrameBudget
from rl_lightning.data.progress import EpisodeLog, Progress
from rl_lightning.data.transfer import DeviceCopies

ROOT = Path(__file__).resolve().parents[2]


def small_run(tmp_path: Path, monkeypatch, *overrides: str) -> Run:
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path)
    return build_run(compose([
        "logger=none", "progress_bar=false", "eval.every_frames=0", "eval.episodes=1", *overrides,
    ]))  # fmt: skip


SAC = ("+experiment=sac_pendulum", "algo.hidden_sizes=[16,16]", "collect.warmup_frames=20", "total_frames=60")
RAINBOW = (
    "+experiment=rainbow_cartpole", "algo.hidden_sizes=[16,16]", "collect.frames_per_batch=16",
    "collect.warmup_frames=32", "total_frames=96", "replay.batch_size=8",
)  # fmt: skip


def test_a_fit_routes_every_copy_of_its_data_path_through_the_switch(tmp_path: Path, monkeypatch) -> None:
    run = small_run(tmp_path, monkeypatch, *SAC, "device=cpu", "replay.device=cpu")
    run.trainer.fit(run.module, datamodule=run.datamodule)
    dm = run.datamodule
    copies = dm.copies.counts
    # 20 random frames, then 40 acted ones: each observation goes to the policy through the switch (and
    # once more when the collector starts: TorchRL calls the policy once to learn what it writes).
    assert copies["observations", "same"] == 1 + 40
    assert copies["frames", "same"] == 60  # one collection of one frame each
    # One update per frame after the warm-up, grouped into rounds whose samples cross together.
    assert 1 <= copies["samples", "same"] <= dm.updates == 41
    assert set(kind for _, kind in copies) == {"same"}  # all on the CPU: nothing to copy


def test_prioritized_replay_sends_its_new_priorities_through_the_switch(tmp_path: Path, monkeypatch) -> None:
    run = small_run(tmp_path, monkeypatch, *RAINBOW, "device=cpu")
    run.trainer.fit(run.module, datamodule=run.datamodule)
    dm = run.datamodule
    assert dm.replay_cfg.prioritized
    # Index and value of each update's priorities; prioritized samples cross one by one.
    assert dm.copies.copied("priorities") == {"same": 2 * dm.updates}
    assert dm.copies.copied("samples") == {"same": dm.updates}


def test_the_callback_turns_the_data_paths_switch_on_and_off_through_the_progress_view() -> None:
    copies = DeviceCopies(torch.device("cpu"), torch.device("cpu"))
    dm = SimpleNamespace(progress=Progress(FrameBudget(100, 10), EpisodeLog(), copies))
    module = SimpleNamespace()
    callback = NonBlockingTransfer(pin_memory=False)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda")), datamodule=dm)
    callback.setup(trainer, module, "fit")
    assert (copies.non_blocking, copies.pin_memory) == (True, False)
    assert vars(module) == {} and vars(dm).keys() == {"progress"}  # no hook shadowed anywhere
    callback.teardown(trainer, module, "fit")
    assert (copies.non_blocking, copies.pin_memory) == (False, False)


def test_copies_say_how_they_crossed() -> None:
    cpu, meta = torch.device("cpu"), torch.device("meta")
    copies = DeviceCopies(meta, cpu)
    td = TensorDict({"x": torch.ones(3)}, [3])
    assert copies.to_module(td).device == meta and copies.to_replay(td) is td
    copies.non_blocking = True  # toward a device other than CUDA a copy stays plain
    copies.to_policy(td)
    assert copies.copied("samples") == {"blocking": 1} and copies.copied("frames") == {"same": 1}
    assert copies.copied("observations") == {"blocking": 1}


# ------------------------------------------------------------------------------------------------ GPU
HOST_REPLAY = (*SAC, "device=cuda", "replay.device=cpu", "seed=3")


def fit_with_host_replay(tmp_path: Path, monkeypatch, callbacks: list) -> Run:
    run = small_run(tmp_path, monkeypatch, *HOST_REPLAY)
    run.trainer.callbacks.extend(callbacks)
    run.trainer.fit(run.module, datamodule=run.datamodule)
    return run


@pytest.mark.gpu
def test_a_host_replay_feeds_the_gpu_with_non_blocking_copies_and_the_same_results(
    tmp_path: Path, monkeypatch
) -> None:
    plain = fit_with_host_replay(tmp_path / "plain", monkeypatch, [])
    fast = fit_with_host_replay(tmp_path / "fast", monkeypatch, [NonBlockingTransfer()])
    assert plain.datamodule.replay.storage.device.type == "cpu"
    assert plain.datamodule.copies.copied("samples") == {
        "blocking": plain.datamodule.copies.counts["samples", "blocking"]
    }
    assert fast.datamodule.copies.counts["samples", "non_blocking"] >= 1
    assert fast.datamodule.copies.counts["observations", "non_blocking"] == 40
    assert not fast.datamodule.copies.non_blocking  # switched off again after the fit
    for (name, a), b in zip(plain.module.state_dict().items(), fast.module.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.gpu
def test_non_blocking_sample_copies_come_from_pinned_memory_without_a_sync() -> None:
    from torch.profiler import ProfilerActivity, profile

    copies = DeviceCopies(torch.device("cuda"), torch.device("cpu"), non_blocking=True)
    rows = TensorDict({"observation": torch.randn(256, 17), "reward": torch.randn(256, 1)}, [256])
    copies.to_module(rows)  # warm-up: CUDA context, pinned-memory pool
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.set_sync_debug_mode("error")  # any synchronisation raises
        try:
            moved = copies.to_module(rows)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()
    assert moved.device.type == "cuda" and torch.equal(moved.cpu()["reward"], rows["reward"])
    memcpy = [e.name for e in prof.events() if "Memcpy" in e.name]
    assert memcpy and all("Pinned" in name for name in memcpy), memcpy


#: Where a fit may wait for the device, each for a reason the docs give: ``(file, function)`` of a frame in
#: the stack of the synchronising call.
SYNC_POINTS = {
    ("rl_lightning/data/transfer.py", "to_env"): "the envs need the actions before they step",
    ("rl_lightning/data/transfer.py", "to_host"): "the host reads what it copies back next",
    ("rl_lightning/training/metrics.py", "log_metrics"): "one read of the metrics per logging interval",
}


class SteadyWindow(L.Callback):
    """From the start of batch ``start`` to the end of the training epoch (before the final evaluation:
    listed first, its hook runs first): CUDA activity under the profiler, and every synchronisation
    recorded with its Python stack (sync debug mode ``warn``: ``error`` would end the fit at the first
    documented one, the actions' copy back to the envs)."""

    def __init__(self, start: int) -> None:
        self.start = start
        self.memcpy: list[str] = []
        self.syncs: list[list[tuple[str, str]]] = []
        self._profiler: Any = None
        self._warnings: Any = None

    def _record(self, message: Any, *args: Any, **kwargs: Any) -> None:
        if "synchroniz" in str(message):
            stack = traceback.extract_stack()
            self.syncs.append([(Path(f.filename).resolve().as_posix(), f.name) for f in stack])

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx != self.start:
            return
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("always")
        warnings.showwarning = self._record
        self._profiler = profile(activities=[ProfilerActivity.CUDA])
        self._profiler.start()
        torch.cuda.set_sync_debug_mode("warn")

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if self._profiler is None:
            return
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        self._profiler.stop()
        self._warnings.__exit__(None, None, None)
        self.memcpy = [e.name for e in self._profiler.events() if "Memcpy HtoD" in e.name]

    def undocumented_syncs(self) -> list[list[tuple[str, str]]]:
        """The synchronisations none of whose frames is a documented sync point."""
        root = ROOT.as_posix()
        points = {(f"{root}/{file}", name) for file, name in SYNC_POINTS}
        return [stack for stack in self.syncs if not points & set(stack)]


def steady_fit(tmp_path: Path, monkeypatch, non_blocking: bool) -> tuple[Run, SteadyWindow]:
    """SAC on a host replay feeding the GPU, 400 frames: the window covers the batches after the first
    two (one Lightning batch holds up to 64 updates)."""
    run = small_run(tmp_path, monkeypatch, *HOST_REPLAY, "total_frames=400")
    window = SteadyWindow(start=2)
    run.trainer.callbacks.insert(0, window)
    if non_blocking:
        run.trainer.callbacks.append(NonBlockingTransfer())
    run.trainer.fit(run.module, datamodule=run.datamodule)
    assert window.memcpy, "the window saw no host-to-device copy"
    return run, window


@pytest.mark.gpu
def test_in_a_steady_window_with_non_blocking_every_copy_to_the_gpu_is_pinned_and_nothing_else_waits(
    tmp_path: Path, monkeypatch
) -> None:
    """With ``non_blocking`` on, every host-to-device copy of the steady window is from pinned memory, and
    the host waits for the device only at the documented sync points (:data:`SYNC_POINTS`). The control,
    the same fit with the toggle off: pageable copies, which wait for the device where they are made."""
    run, window = steady_fit(tmp_path / "on", monkeypatch, non_blocking=True)
    assert all("Pinned -> Device" in name for name in window.memcpy), Counter(window.memcpy)
    assert run.datamodule.copies.counts["samples", "non_blocking"] > 0
    assert window.undocumented_syncs() == []
    _, control = steady_fit(tmp_path / "off", monkeypatch, non_blocking=False)
    assert any("Pageable -> Device" in name for name in control.memcpy), Counter(control.memcpy)
    waits = {frame for stack in control.undocumented_syncs() for frame in stack}
    assert (f"{ROOT.as_posix()}/rl_lightning/data/transfer.py", "to_module") in waits
