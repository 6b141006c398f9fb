"""ThroughputMonitor and GPUMonitor."""

from __future__ import annotations

import logging
import math
import sys
from types import SimpleNamespace

import pytest
import torch
from helpers.toy import MemoryLogger, ToyProtocolModule, assert_state_close, baseline_state, fit_toy

from callbacks import GPUMonitor, ThroughputMonitor

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
on_cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour")
GPU_KEYS = {
    "gpu/utilization",
    "gpu/memory_used_mb",
    "gpu/memory_total_mb",
    "gpu/temperature_c",
    "gpu/power_w",
}


# --- ThroughputMonitor -----------------------------------------------------------------------------------


def test_throughput_rejects_bad_arguments() -> None:
    for every in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="log_every_n_steps"):
            ThroughputMonitor(log_every_n_steps=every)
    with pytest.raises(ValueError, match="log_frames"):
        ThroughputMonitor(log_frames="yes")


@pytest.fixture(scope="module")
def throughput_fit():
    monitor = ThroughputMonitor(log_every_n_steps=4)
    logger = MemoryLogger()
    module, datamodule, _ = fit_toy([monitor], logger=logger, steps=13)
    return monitor, logger, module, datamodule


def test_throughput_logs_rates_after_the_warmup_window(throughput_fit) -> None:
    monitor, logger, _, datamodule = throughput_fit
    # 13 batches in windows of 4: three windows end, the first (warm-up) is not reported.
    assert monitor.windows == 3
    records = [(step, m) for step, m in logger.records if "time/updates_per_s" in m]
    assert len(records) == 2
    for step, metrics in records:
        assert set(metrics) == {"time/env_sps", "time/updates_per_s", "time/frames"}
        assert all(math.isfinite(v) and v > 0 for v in metrics.values())
        # 32 env frames are collected per update, so the two rates differ by exactly that factor.
        assert metrics["time/env_sps"] / metrics["time/updates_per_s"] == pytest.approx(datamodule.batch_size)
        assert step == metrics["time/frames"]  # the x-axis is environment frames
    assert monitor.updates_per_s == records[-1][1]["time/updates_per_s"]
    assert monitor.env_sps == records[-1][1]["time/env_sps"]


def test_throughput_state_round_trip(throughput_fit) -> None:
    monitor = throughput_fit[0]
    restored = ThroughputMonitor(log_every_n_steps=4)
    restored.load_state_dict(monitor.state_dict())
    assert restored.updates == monitor.updates == 13
    assert (restored.env_sps, restored.updates_per_s) == (monitor.env_sps, monitor.updates_per_s)


def test_throughput_leaves_results_unchanged(throughput_fit) -> None:
    module = throughput_fit[2]
    # Same seed and steps as the baseline except one more batch; compare against a 13-step baseline.
    assert_state_close(module, baseline_state(steps=13), atol=0)


def test_throughput_without_frame_counter_reports_updates_only() -> None:
    monitor = ThroughputMonitor(log_every_n_steps=2)
    logger = MemoryLogger()
    trainer = SimpleNamespace(datamodule=None, loggers=[logger], global_step=0)
    module = ToyProtocolModule()
    monitor.on_train_start(trainer, module)
    for _ in range(6):
        monitor.on_train_batch_end(trainer, module, None, None, 0)
    assert monitor.env_sps is None and monitor.updates_per_s > 0
    assert [set(m) for _, m in logger.records] == [{"time/updates_per_s"}] * 2


def test_throughput_checkpoint_keeps_counters(tmp_path) -> None:
    monitor = ThroughputMonitor(log_every_n_steps=3)
    _, _, trainer = fit_toy([monitor], steps=7)
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    saved = torch.load(path, weights_only=False)["callbacks"][monitor.state_key]
    fresh = ThroughputMonitor(log_every_n_steps=3)
    fresh.load_state_dict(saved)
    assert fresh.updates == 7 and fresh.updates_per_s == monitor.updates_per_s


# --- GPUMonitor ------------------------------------------------------------------------------------------


class FakeNVML:
    """The pynvml calls GPUMonitor makes, with fixed readings; power can be made unsupported."""

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, power_supported: bool = True) -> None:
        self.power_supported = power_supported
        self.power_calls = 0

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=3 * 2**30, total=80 * 2**30, free=77 * 2**30)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 61

    def nvmlDeviceGetPowerUsage(self, handle):
        self.power_calls += 1
        if not self.power_supported:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 312_500  # milliwatts

    def nvmlShutdown(self):
        pass


def test_gpu_monitor_rejects_bad_interval() -> None:
    for interval in (0, -1.0, "5", True):
        with pytest.raises(ValueError, match="interval_s"):
            GPUMonitor(interval_s=interval)


@on_cpu_only
def test_gpu_monitor_is_a_noop_on_cpu(caplog: pytest.LogCaptureFixture) -> None:
    monitor, logger = GPUMonitor(interval_s=0.001), MemoryLogger()
    with caplog.at_level(logging.INFO):
        module, _, _ = fit_toy([monitor], logger=logger)
    assert "GPUMonitor: no CUDA device" in caplog.text
    assert monitor.samples == 0 and not any(GPU_KEYS & set(m) for _, m in logger.records)
    assert_state_close(module, baseline_state(), atol=0)


def test_gpu_monitor_without_pynvml(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    monitor = GPUMonitor()
    with caplog.at_level(logging.INFO):
        monitor.setup(trainer, ToyProtocolModule(), "fit")
    assert "pip install nvidia-ml-py" in caplog.text
    assert monitor.sample() == {}


def test_gpu_monitor_readings_and_units() -> None:
    monitor = GPUMonitor()
    monitor.attach(FakeNVML(), handle=object())
    assert monitor.sample() == {
        "gpu/utilization": 87.0,
        "gpu/memory_used_mb": 3 * 1024.0,
        "gpu/memory_total_mb": 80 * 1024.0,
        "gpu/temperature_c": 61.0,
        "gpu/power_w": 312.5,
    }


def test_gpu_monitor_drops_unsupported_readings() -> None:
    nvml = FakeNVML(power_supported=False)
    monitor = GPUMonitor()
    monitor.attach(nvml, handle=object())
    assert set(monitor.sample()) == GPU_KEYS - {"gpu/power_w"}
    monitor.sample()
    assert nvml.power_calls == 1  # not asked again after the first failure


def test_gpu_monitor_samples_on_wall_clock_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("callbacks.gpu_monitor.time.perf_counter", lambda: now[0])
    logger = MemoryLogger()
    datamodule = SimpleNamespace(progress=SimpleNamespace(frames=640))
    trainer = SimpleNamespace(datamodule=datamodule, loggers=[logger], global_step=10)
    monitor = GPUMonitor(interval_s=5.0)
    monitor.attach(FakeNVML(), handle=object())
    for dt in (0.0, 1.0, 2.0, 2.5, 1.0, 6.0):  # cumulative: 100, 101, 103, 105.5, 106.5, 112.5
        now[0] += dt
        monitor.on_train_batch_end(trainer, None, None, None, 0)
    assert monitor.samples == 3  # at 100, 105.5 and 112.5
    assert [step for step, _ in logger.records] == [640, 640, 640]  # logged against frames
    assert all(set(m) == GPU_KEYS for _, m in logger.records)
    restored = GPUMonitor()
    restored.load_state_dict(monitor.state_dict())
    assert restored.samples == 3


@pytest.mark.gpu
@needs_cuda
def test_gpu_monitor_on_gpu() -> None:
    pytest.importorskip("pynvml")
    monitor, logger = GPUMonitor(interval_s=0.0001), MemoryLogger()
    fit_toy([monitor], logger=logger, accelerator="gpu")
    assert monitor.samples > 0
    last = logger.records[-1][1]
    assert {"gpu/utilization", "gpu/memory_used_mb", "gpu/memory_total_mb"} <= set(last)
    assert 0 < last["gpu/memory_used_mb"] <= last["gpu/memory_total_mb"]
