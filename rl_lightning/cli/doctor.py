"""``python -m rl_lightning doctor``: what this machine offers a run, and which settings to use on it.

Sections: device (CUDA, device name and memory, bf16), TF32 flags, ``torch.compile`` (does it work here,
how long a first compile takes, compiled against eager speed of a small MLP), CPU (cores, load, a small
MLP update with one torch thread against one per core, for the ``torch_threads`` setting; whether it can
flush subnormal floats, for ``flush_denormal``), library
versions, and recommendations derived from those measurements rather than from rules of thumb.

The compile probe runs in a subprocess with a time limit (``doctor.timeout_s``), so a hanging compiler or
a missing C++ toolchain shows up as a line in the report, and compile caches and flags stay out of this
process. ``doctor.compile=false`` skips it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

__all__ = ["LIBRARIES", "compile_probe", "doctor", "library_versions", "machine_info"]

#: Distribution names reported by ``doctor`` and stored with benchmark results.
LIBRARIES = (
    "torch",
    "lightning",
    "torchrl",
    "tensordict",
    "gymnasium",
    "hydra-core",
    "mlflow",
    "box2d",
    "nvidia-ml-py",
    "rich",
    "numpy",
)

# A DQN-sized network: the size of network the experiments of this project train on a CPU.
_OBS, _HIDDEN, _OUT, _BATCH = 8, 256, 4, 64


def library_versions() -> dict[str, str | None]:
    """Installed versions of :data:`LIBRARIES` (``None``: not installed)."""
    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        found = None
        for candidate in (name, name.lower(), name.upper(), "Box2D" if name == "box2d" else name):
            try:
                found = metadata.version(candidate)
                break
            except metadata.PackageNotFoundError:
                continue
        out[name] = found
    try:
        import pynvml  # noqa: F401

        out["pynvml importable"] = "yes"
    except ImportError:
        out["pynvml importable"] = None
    return out


def machine_info() -> dict[str, Any]:
    """Where figures were taken: platform, CPUs, load, device and library versions."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["cuda_version"] = torch.version.cuda
    info["libraries"] = library_versions()
    return info


# ---------------------------------------------------------------------------------------------- measuring
def _mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(_OBS, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, _HIDDEN), nn.ReLU(), nn.Linear(_HIDDEN, _OUT)
    )


def _per_call_s(fn: Callable[[], Any], seconds: float = 0.5, warmup: int = 3) -> float:
    """Mean seconds per call of ``fn`` over about ``seconds`` of calls (after ``warmup`` calls)."""
    for _ in range(warmup):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 10:
            return elapsed / n


def _update_step(net: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> Callable[[], None]:
    """One regression step (forward, backward, Adam) of ``net`` on a fixed batch."""
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x, y = torch.randn(_BATCH, _OBS), torch.randn(_BATCH, _OUT)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        loss_fn(x, y).backward()
        opt.step()

    return step


def _usable_cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_probe() -> dict[str, float]:
    """Seconds per MLP update (CPU, eager) with one torch thread per usable core and with one thread."""
    previous, many = torch.get_num_threads(), _usable_cpus()
    torch.manual_seed(0)
    net = _mlp()

    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((net(x) - y) ** 2).mean()

    step = _update_step(net, loss)
    try:
        torch.set_num_threads(many)
        out = {"many_threads": float(many), "many_s": _per_call_s(step)}
        torch.set_num_threads(1)
        out["one_thread_s"] = _per_call_s(step)
    finally:
        torch.set_num_threads(previous)
    return out


def compile_probe() -> None:
    """Entry point of the probe subprocess (argument: torch threads): prints one JSON line of timings."""
    if len(sys.argv) > 1 and sys.argv[1] != "None":
        torch.set_num_threads(int(sys.argv[1]))
    result: dict[str, Any] = {"threads": torch.get_num_threads()}
    try:
        start = time.perf_counter()
        tiny = torch.compile(lambda x: torch.sin(x) * 2 + x)
        tiny(torch.randn(16))
        result["tiny_compile_s"] = time.perf_counter() - start

        torch.manual_seed(0)
        net = _mlp()
        obs = torch.randn(1, _OBS)

        def act(x: torch.Tensor) -> torch.Tensor:
            return net(x).argmax(-1)

        compiled_act = torch.compile(act)
        with torch.no_grad():
            start = time.perf_counter()
            compiled_act(obs)
            result["act_compile_s"] = time.perf_counter() - start
            result["act_eager_s"] = _per_call_s(lambda: act(obs))
            result["act_compiled_s"] = _per_call_s(lambda: compiled_act(obs))

        def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return ((net(x) - y) ** 2).mean()

        compiled_loss = torch.compile(loss)
        eager_step, compiled_step = _update_step(net, loss), _update_step(net, compiled_loss)
        start = time.perf_counter()
        compiled_step()
        result["update_compile_s"] = time.perf_counter() - start
        result["update_eager_s"] = _per_call_s(eager_step)
        result["update_compiled_s"] = _per_call_s(compiled_step)
    except Exception as err:  # the report says what failed instead of a traceback
        result["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"
    print(json.dumps(result))


def run_compile_probe(timeout_s: float, threads: int | None) -> dict[str, Any]:
    """Runs :func:`compile_probe` in a subprocess; ``{"error": ...}`` when it fails or times out."""
    code = "from rl_lightning.cli.doctor import compile_probe; compile_probe()"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, str(threads)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"no result within doctor.timeout_s={timeout_s:g} s (compiler hanging or very slow)"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"probe exited with {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------- report
def _section(title: str, rows: dict[str, Any]) -> list[str]:
    width = max((len(k) for k in rows), default=0)
    return [f"{title}", *(f"  {k:<{width}}  {v}" for k, v in rows.items()), ""]


def _device_rows() -> dict[str, Any]:
    if not torch.cuda.is_available():
        built = torch.version.cuda or "no (CPU-only build)"
        return {"CUDA available": "no", "torch built with CUDA": built}
    props = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info(0)
    return {
        "CUDA available": f"yes ({torch.cuda.device_count()} device(s), CUDA {torch.version.cuda})",
        "device 0": f"{props.name}, compute capability {props.major}.{props.minor}",
        "memory": f"{total / 2**30:.1f} GiB total, {free / 2**30:.1f} GiB free",
        "bf16 supported": "yes" if torch.cuda.is_bf16_supported() else "no",
    }


def _tf32_rows() -> dict[str, Any]:
    return {
        "matmul (cuda.matmul.allow_tf32)": torch.backends.cuda.matmul.allow_tf32,
        "cudnn (cudnn.allow_tf32)": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }


def _compile_rows(probe: dict[str, Any] | None) -> dict[str, Any]:
    if probe is None:
        return {"probe": "skipped (doctor.compile=false)"}
    if "error" in probe and "tiny_compile_s" not in probe:
        return {"works": f"no: {probe['error']}"}
    rows: dict[str, Any] = {"works": "yes", "first compile (tiny fn)": f"{probe['tiny_compile_s']:.1f} s"}
    threads = probe.get("threads", "?")
    for path, label in (("act", "MLP act, batch 1"), ("update", f"MLP update, batch {_BATCH}")):
        label = f"{label}, {threads} thread(s)"
        if f"{path}_compiled_s" in probe:
            eager, compiled = probe[f"{path}_eager_s"], probe[f"{path}_compiled_s"]
            rows[label] = (
                f"compile {probe[f'{path}_compile_s']:.1f} s; eager {eager * 1e3:.3f} ms, "
                f"compiled {compiled * 1e3:.3f} ms ({eager / compiled:.2f}x eager speed)"
            )
    if "error" in probe:
        rows["failed later"] = probe["error"]
    return rows


def flush_denormal_supported() -> bool:
    """Whether this CPU has a flush-to-zero mode for ``flush_denormal`` (this thread's mode is kept)."""
    from rl_lightning.cli.process import flushes_denormals

    before = flushes_denormals()
    try:
        return torch.set_flush_denormal(True)
    finally:
        torch.set_flush_denormal(before)


def _cpu_rows(threads: dict[str, float], setting: int | None, flush: bool | None) -> dict[str, Any]:
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    many = int(threads["many_threads"])
    can = "can" if flush_denormal_supported() else "cannot (the setting does nothing)"
    return {
        "cores": os.cpu_count(),
        "usable by this process": _usable_cpus(),
        "load average (1/5/15 min)": " / ".join(f"{x:.2f}" for x in load) if load else "n/a",
        "torch_threads setting": "null (one per core)" if setting is None else setting,
        "flush_denormal setting": f"{'true' if flush else 'false'} (this CPU {can} flush subnormal floats)",
        f"MLP update, {many} thread(s)": f"{threads['many_s'] * 1e3:.2f} ms",
        "MLP update, 1 thread": f"{threads['one_thread_s'] * 1e3:.2f} ms",
    }


def recommendations(
    cuda: bool, probe: dict[str, Any] | None, threads: dict[str, float], setting: int | None = 1
) -> list[str]:
    """Advice from the measurements above (one line each); ``setting`` is the ``torch_threads`` config."""
    out = []
    if not cuda:
        out.append(
            "no CUDA: keep callbacks=default; non_blocking, tf32, cuda_graphs, gpu_monitor and cuda_cache "
            "are no-ops on a CPU; compile, fused_optimizer and mixed_precision (bf16) act: measure them on "
            "your experiment with `python -m rl_lightning bench +experiment=NAME`."
        )
    else:
        out.append(
            "CUDA: try callbacks=fast (compile + CUDA graphs + fused optimizer + TF32) and compare "
            "with `python -m rl_lightning bench +experiment=NAME`."
        )
        if not torch.backends.cuda.matmul.allow_tf32:
            out.append("TF32 is off: the tf32 callback (part of callbacks=fast) turns it on for a run.")
        try:
            import pynvml  # noqa: F401
        except ImportError:
            out.append("pynvml is missing: `pip install rl_lightning[gpu]` for the gpu_monitor callback.")
    if probe is not None:
        if "act_compiled_s" not in probe or "update_compiled_s" not in probe:
            out.append(f"torch.compile does not work here ({probe.get('error', '?')}): leave compile off.")
        elif not cuda:
            speed = probe["update_eager_s"] / probe["update_compiled_s"]
            act_speed = probe["act_eager_s"] / probe["act_compiled_s"]
            verdict = "faster" if speed > 1.05 else "slower" if speed < 0.95 else "no faster"
            cost = probe["update_compile_s"] + probe["act_compile_s"]
            advice = (
                "worth trying on long runs (callbacks=[default,compile])"
                if speed > 1.05
                else "keep compile off on this CPU"
            )
            out.append(
                f"compile on this CPU: a small MLP update runs {speed:.2f}x eager speed ({verdict}), acting "
                f"{act_speed:.2f}x, after {cost:.0f} s of compiling: {advice}."
            )
    many = int(threads["many_threads"])
    ratio = threads["many_s"] / threads["one_thread_s"]
    if many > 1 and ratio > 1.2:
        keep = "keep torch_threads=1 (the default)" if setting == 1 else "set torch_threads=1"
        out.append(
            f"one torch thread is {ratio:.1f}x faster than {many} for a small MLP update here (cores shared "
            f"or few): {keep}."
        )
    elif many > 1 and ratio < 1 / 1.2:
        out.append(
            f"{many} torch threads are {1 / ratio:.1f}x faster than one for a small MLP update here: "
            "try torch_threads=null (one per core) for larger networks and batches."
        )
    return out


def doctor(cfg: DictConfig) -> dict[str, Any]:
    """Prints the report (see the module docstring) and returns its data."""
    node = cfg.get("doctor") or {}
    do_compile = bool(node.get("compile", True))
    timeout_s = float(node.get("timeout_s", 180))
    cuda = torch.cuda.is_available()
    setting = cfg.get("torch_threads")
    threads = thread_probe()
    probe = run_compile_probe(timeout_s, setting) if do_compile else None
    lines = ["rl_lightning doctor", ""]
    lines += _section("device", _device_rows())
    lines += _section("TF32", _tf32_rows())
    lines += _section("torch.compile", _compile_rows(probe))
    lines += _section("CPU", _cpu_rows(threads, setting, cfg.get("flush_denormal")))
    versions = {k: v or "not installed" for k, v in library_versions().items()}
    lines += _section("libraries", {"python": sys.version.split()[0], **versions})
    advice = recommendations(cuda, probe, threads, setting)
    lines += ["recommendations", *(f"  - {line}" for line in advice)]
    print("\n".join(lines))
    return {"cuda": cuda, "compile": probe, "threads": threads, "recommendations": advice}
