"""Planning latency of TD-MPC2: wall time of one ``act`` call (encode + the whole MPPI plan) per action.

The module is built from ``+experiment=tdmpc2_hockey`` (hockey's 18-dim observation, 4-dim action) with
the reference planner (6 iterations, 512 samples, 24 policy-prior, 64 elites, horizon 3), for the 5M and
the 1M model, on the CPU and, where there is one, the GPU. Warm-up calls are excluded; the median over the
timed calls is the figure (the machine may be shared), with min and mean beside it. On CUDA every call is
synchronised, so the figure is the full latency of an action.

Variants (``--variants``), each the mechanism the training callbacks use on ``act``:
- ``eager``: no compile, no CUDA graphs.
- ``compiled``: ``torch.compile(act)`` with ``TorchCompile``'s defaults (mode ``default``, ``dynamic=False``).
- ``cuda_graphs`` (CUDA only): ``act`` captured and replayed by ``CudaGraphs``' ``GraphedPath``.
- ``compiled_graphs`` (CUDA only): the compiled ``act`` captured by ``GraphedPath``, as ``callbacks=fast``.
Precisions (``--precisions``, CUDA only beyond ``fp32``): ``tf32`` switches on TF32 matmuls as the ``TF32``
callback does; ``bf16`` adds ``torch.autocast(bfloat16)`` around ``act`` inside the compiled and graphed
region, as ``MixedPrecision`` listed before ``TorchCompile`` does.
Heads (``--heads``): ``separate`` plans with the world model as it is; ``stacked`` evaluates the heads each
rollout step runs on one input (dynamics, reward and, for an episodic model, the termination of the latent
just reached) as one stacked network (:class:`StackedHeads`): one matrix product for their first layers, one
batched product for their second, one LayerNorm and one Mish each. A candidate for the GPU, where a plan's
small matrix products leave most of the device idle and each launch counts; ``value_max_abs_diff`` is the
largest difference of the planner's values from the two, on the same inputs and random draws. ``streams``
runs each MPPI iteration with the rollout's reward and termination heads on two side streams beside the
dynamics chain (:class:`SideStreamIteration`; with a compiled variant each piece is compiled apart): a CUDA
graph captured from it holds parallel branches, so about half of an iteration's kernels wait on each other
in a line; its ``value_max_abs_diff`` compares a whole iteration's outputs (on the GPU's streams, pieces
uncompiled). On the CPU it runs the same pieces in order. Several heads are timed on one module in
``--blocks`` alternating blocks, each row with ``ms_ratio_to_separate`` (the median of the per-block
ratios).
``--compile-mode`` sets ``torch.compile``'s mode for the compiled variants (``default``, as ``TorchCompile``
by default, or ``max-autotune-no-cudagraphs``, which times candidate kernels for each matrix product and
may generate Triton ones). One mode per run: two compiled copies of ``act`` would share its code's compile
cache. ``compile_s`` is the wall time of the first (compiling) call. ``--kernels`` adds, on CUDA, the device
kernels one plan of each variant runs (count, summed kernel time and the costliest, from ``torch.profiler``).
The eager plan's are the floor a graphed plan cannot go under unless compile fuses kernels; the compiled
plan's say how many kernels compile left and which ones its time goes to; a graphed plan's are the kernels
the profiler sees inside a replay.

Usage: python benchmarks/tdmpc2_plan_latency.py [--calls 30] [--warmup 5] [--threads 1]
    [--num-envs 1 8] [--sizes 5M 1M] [--devices cpu cuda] [--variants eager compiled cuda_graphs
    compiled_graphs] [--precisions fp32 tf32 bf16] [--heads separate stacked streams] [--blocks N]
    [--kernels] [--compile-mode default|max-autotune-no-cudagraphs]
    [--out benchmarks/results/tdmpc2_plan_latency.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from tensordict import TensorDict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import command_line, relative_paths
from tdmpc2_pendulum import RESULTS, machine_info

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from callbacks._graphed_path import GraphedPath
from callbacks.torch_compile import GRAPH_MODES, MODES
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config
from rl_lightning.nn.layers import eval_mode

VARIANTS = ("eager", "compiled", "cuda_graphs", "compiled_graphs")
#: ``TorchCompile``'s modes that leave CUDA graphs to ``GraphedPath`` (the others record their own).
COMPILE_MODES = tuple(mode for mode in MODES if mode not in GRAPH_MODES)
HEADS = ("separate", "stacked", "streams")
PLANNER_KEYS = ("horizon", "iterations", "num_samples", "num_pi_trajs", "num_elites")
CUDA_ONLY = ("cuda_graphs", "compiled_graphs")
PRECISIONS = ("fp32", "tf32", "bf16")


class StackedHeads:
    """The heads one step of a latent rollout evaluates, as one stacked network.

    ``next(z, a)`` and ``reward(z, a)`` read ``[z, a]``; the termination head reads ``z`` alone, which the
    first layer's zero weights for ``a`` make the same input. The first layers run as one ``addmm``, the
    hidden layers as one ``baddbmm``, each followed by one LayerNorm (the per-head affine maps stacked) and
    one Mish; the output layers differ in width and run apart. The stacked weights are built from the live
    parameters on construction, so a compiled or graphed plan reads the parameters of every call.
    """

    def __init__(self, model) -> None:
        heads = [model.dynamics, model.reward_net]
        if model.termination_net is not None:
            heads.append(model.termination_net)
        first, second = [h[0] for h in heads], [h[1] for h in heads]
        if any(layer.dropout is not None for layer in first + second):
            raise ValueError("StackedHeads: the heads of a rollout have no dropout.")
        weights = [first[0].weight, first[1].weight]
        if len(heads) == 3:  # zero weights for the action: the termination head reads z alone
            weights.append(F.pad(first[2].weight, (0, model.action_dim)))
        self.w1, self.b1 = torch.cat(weights), torch.cat([layer.bias for layer in first])
        self.ln1 = [torch.stack([getattr(layer.ln, k) for layer in first]) for k in ("weight", "bias")]
        self.w2 = torch.stack([layer.weight for layer in second]).transpose(1, 2)
        self.b2 = torch.stack([layer.bias for layer in second]).unsqueeze(1)
        self.ln2 = [
            torch.stack([getattr(layer.ln, k) for layer in second]).unsqueeze(1) for k in ("weight", "bias")
        ]
        self.width, self.eps, self.act = first[0].out_features, first[0].ln.eps, first[0].act
        self.out = [h[-1] for h in heads]
        self.two_hot_inv = model.two_hot_inv

    def _norm_act(self, h: torch.Tensor, affine: list[torch.Tensor], k: int) -> torch.Tensor:
        return self.act(F.layer_norm(h, (self.width,), eps=self.eps) * affine[0][:k] + affine[1][:k])

    def __call__(self, z: torch.Tensor, a: torch.Tensor, termination: bool):
        """``(next latent, decoded reward, termination probability of z or None)`` for ``z [M, latent]``."""
        k, w = (3 if termination else 2), self.width
        h = torch.addmm(self.b1[: k * w], torch.cat([z, a], -1), self.w1[: k * w].t()).view(-1, k, w)
        h = self._norm_act(h, self.ln1, k)
        h = self._norm_act(torch.baddbmm(self.b2[:k], h.transpose(0, 1), self.w2[:k]), self.ln2, k)
        term = torch.sigmoid(self.out[2](h[2])) if termination else None
        return self.out[0](h[0]), self.two_hot_inv(self.out[1](h[1])), term


def stacked_estimate_value(self, model, z: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``MPPIPlanner.estimate_value`` with :class:`StackedHeads`: the same random draws and the planner's own
    sum (``discounted_value``); the termination of the latent reached at step ``t`` is computed at step
    ``t + 1``, with that step's heads."""
    heads = StackedHeads(model)
    rewards, alive = [], []
    for t in range(self.horizon):
        z_next, reward, term = heads(z, actions[t], termination=model.episodic and t > 0)
        if term is not None:
            alive.append((term <= 0.5).to(z.dtype))
        rewards.append(reward)
        z = z_next
    if model.episodic:
        alive.append(self.alive_mask(model, z))
    return self.discounted_value(rewards, alive, self.bootstrap(model, z))


class SideStreamIteration:
    """One MPPI iteration with each rollout step's reward and termination heads on side streams.

    The planner's iteration runs its heads one after another on one stream: per rollout step the dynamics,
    the reward and (episodic model) the termination MLP, then the policy and the Q-ensemble at the horizon.
    Only the dynamics chain feeds the next step: the reward of step ``t`` reads ``(z_t, a_t)``, the
    termination mask reads ``z_{t+1}``, and neither feeds a latent. Here the rewards run on one side stream
    and the termination masks on another, each waiting for the latent it reads, while the dynamics, the
    bootstrap ``Q(z_H, pi(z_H))`` and the refit stay on the calling stream, which waits for both before the
    refit. A CUDA graph captured from it holds parallel branches: an iteration's kernels in a line are then
    the sampling, three dynamics steps, the bootstrap and the refit, about half of them, and the small
    products of the side streams fill SMs the main stream's leave idle.

    The planner's own pieces (:meth:`MPPIPlanner.sample_actions`, :meth:`MPPIPlanner.discounted_value`,
    :meth:`MPPIPlanner.refit`) compute the same values with the same random draws. With ``compile_mode``
    each piece is compiled apart (``dynamic=False``) and the iteration itself is left out of the compiled
    graph (``torch.compiler.disable``): an Inductor-generated function launches all its kernels on the
    stream that is current when it is called, so the switches must come between compiled calls. The
    tensors one stream makes and another reads stay referenced until the streams join, so the caching
    allocator cannot hand their memory to the other stream early. On the CPU there are no streams and the
    pieces run in order.
    """

    def __init__(self, planner, model, compile_mode: str | None = None) -> None:
        self.planner, self.model, self.episodic = planner, model, model.episodic
        device = next(model.parameters()).device
        self.side = [torch.cuda.Stream(device) for _ in range(2)] if device.type == "cuda" else None

        def compiled(fn):
            return fn if compile_mode is None else torch.compile(fn, mode=compile_mode, dynamic=False)

        self.sample = compiled(planner.sample_actions)
        self.reward = compiled(model.predict_reward)
        self.next = compiled(model.next)
        self.alive = compiled(functools.partial(planner.alive_mask, model))
        self.bootstrap = compiled(functools.partial(planner.bootstrap, model))
        self.refit = compiled(lambda a, r, m, q: planner.refit(a, planner.discounted_value(r, m, q)))

    def _on(self, i: int, main):
        """Stream ``i`` from here on, after the work the main stream has queued so far."""
        if self.side is None:
            return contextlib.nullcontext()
        self.side[i].wait_stream(main)
        return torch.cuda.stream(self.side[i])

    @torch.compiler.disable
    def __call__(self, model, z_rep, mean, std, pi_actions):
        """What :meth:`MPPIPlanner._iteration` returns, for the same arguments (the pieces hold the model
        this was built with; ``model`` is the planner's argument, checked to be that one)."""
        if model is not self.model:
            raise ValueError("SideStreamIteration: built for another model than the one it is called with.")
        h = self.planner.horizon
        actions = self.sample(mean, std, pi_actions)
        flat = actions.reshape(h, -1, self.planner.action_dim)
        main = torch.cuda.current_stream(z_rep.device) if self.side else None
        zs, rewards, alive = [z_rep], [], []
        for t in range(h):
            with self._on(0, main):
                rewards.append(self.reward(zs[t], flat[t]))
            zs.append(self.next(zs[t], flat[t]))
            if self.episodic:
                with self._on(1, main):
                    alive.append(self.alive(zs[t + 1]))
        q = self.bootstrap(zs[h])
        if self.side:
            for stream in self.side:
                main.wait_stream(stream)
        return self.refit(actions, rewards, alive, q)


def perturb(model: torch.nn.Module, scale: float = 0.02, seed: int = 0) -> torch.nn.Module:
    """Adds seeded noise (``scale`` times a standard normal) to every weight of ``model``, in place: the
    untrained model's zero-initialised last layers give every action sequence the value 0, and the elites
    are then ties."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn(p.shape, generator=gen).to(p.device))
    return model


def value_difference(module, device: str, heads: str) -> float:
    """Largest difference from the planner's own computation, same inputs and draws: of the values for
    ``stacked``; of a whole iteration's outputs (mean, std, elites, their weights) for ``streams``, whose
    pieces run uncompiled on the streams (on a GPU)."""
    planner, model, hp = module.planner, module.model, module.hparams
    with torch.no_grad(), eval_mode(model):  # as the module plans
        z = model.encode(torch.randn(hp.num_samples, module.obs_shape[0], device=device))
        if heads == "stacked":
            actions = torch.rand(hp.horizon, hp.num_samples, module.action_dim, device=device) * 2 - 1
            torch.manual_seed(1)
            separate = type(planner).estimate_value(planner, model, z, actions)
            torch.manual_seed(1)
            stacked = stacked_estimate_value(planner, model, z, actions)
            return float((separate - stacked).abs().max())
        z_rep = z[: planner.num_envs].repeat_interleave(planner.num_samples, 0)
        mean = torch.rand(planner.horizon, planner.num_envs, module.action_dim, device=device) - 0.5
        std, pi_actions = torch.full_like(mean, 0.5), None
        if planner.num_pi_trajs:
            pi_actions = planner._policy_actions(model, z[: planner.num_envs])
        torch.manual_seed(1)
        own = type(planner)._iteration(planner, model, z_rep, mean, std, pi_actions)
        torch.manual_seed(1)
        streamed = SideStreamIteration(planner, model)(model, z_rep, mean, std, pi_actions)
        return max(float((a - b).abs().max()) for a, b in zip(own, streamed))


def set_precision(precision: str) -> None:
    """TF32 matmuls on or off (the ``TF32`` callback's switches); ``bf16`` runs on TF32 as well."""
    on = precision in ("tf32", "bf16")
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def with_autocast(act, device: str):
    def run(td):
        with torch.autocast(device, dtype=torch.bfloat16, cache_enabled=False):
            return act(td)

    return run


def planning_module(
    size: str | None, num_envs: int, device: str, experiment: str = "tdmpc2_hockey"
) -> tuple[torch.nn.Module, Callable[[], TensorDict]]:
    """The experiment's TD-MPC2 module (at ``size``; ``None``: the experiment's) in train mode, and a function
    returning an observation batch for its ``act``."""
    sized = [f"algo.model_size={size}"] if size else []
    cfg = compose([f"+experiment={experiment}", *sized, f"env.num_envs={num_envs}", "logger=none"])
    module = build_module(cfg, env_config(cfg)).to(device)
    module.train()
    obs = torch.randn(num_envs, module.obs_shape[0], device=device)
    steps = torch.ones(num_envs, 1, dtype=torch.int64, device=device)
    return module, lambda: TensorDict({"observation": obs, "step_count": steps}, [num_envs], device=device)


def graphed(act, device: str):
    """``act`` captured in a CUDA graph after 3 warm-up calls, as the ``CudaGraphs`` callback does."""
    return GraphedPath(act, "act", warmup=3, device=torch.device(device), step_counter=lambda: 0,
                       add_steps=lambda n: None)  # fmt: skip


def timed(act, td, device: str) -> float:
    """Seconds of one ``act(td)`` call, the device synchronised before and after."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    act(td)
    sync()
    return time.perf_counter() - start


def wrapped_act(
    module: torch.nn.Module,
    variant: str,
    device: str,
    precision: str = "fp32",
    heads: str = "separate",
    compile_mode: str = "default",
):
    """``module.act`` as the variant's callbacks would leave it, planning with the ``heads`` estimator (set
    outside the compiled code, at each call; a captured graph keeps the one it was captured with)."""
    act = module.act
    if precision == "bf16":
        act = with_autocast(act, device)
    if variant in ("compiled", "compiled_graphs"):
        act = torch.compile(act, mode=compile_mode, fullgraph=False, dynamic=False)
    act = with_heads(module, heads, act, compile_mode if variant.startswith("compiled") else None)
    if variant in CUDA_ONLY:
        act = graphed(act, device)
    return act


def with_heads(module: torch.nn.Module, heads: str, act, compile_mode: str | None = None):
    """``act`` planning with the ``heads`` estimator: ``stacked`` sets it on the planner first, ``streams``
    sets the planner's iteration to a :class:`SideStreamIteration` (its pieces compiled with
    ``compile_mode``, if given), ``separate`` removes any such setting, so the planner's own methods run."""
    planner = module.planner
    stacked = types.MethodType(stacked_estimate_value, planner)
    streamed = SideStreamIteration(planner, module.model, compile_mode) if heads == "streams" else None

    def run(td):
        planner.__dict__.pop("estimate_value", None)
        planner.__dict__.pop("_iterate", None)
        if heads == "stacked":
            planner.estimate_value = stacked
        elif heads == "streams":
            planner._iterate = streamed
        return act(td)

    return run


def kernels(act, td_fn, calls: int = 5) -> dict[str, object]:
    """Device kernels per plan: count, summed kernel time and the five costliest by total time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            act(td_fn())
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per_name: dict[str, float] = {}
    for e in events:
        per_name[e.name] = per_name.get(e.name, 0.0) + e.device_time
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:5]
    return {
        "kernels_per_plan": len(events) / calls,
        "kernel_ms_per_plan": round(sum(e.device_time for e in events) / calls / 1e3, 3),
        "top_kernels_ms_per_plan": {name[:80]: round(t / calls / 1e3, 3) for name, t in top},
    }


def latency(
    size: str,
    device: str,
    num_envs: int,
    calls: int,
    warmup: int,
    variant: str = "eager",
    kernel_table: bool = False,
    precision: str = "fp32",
    heads: tuple[str, ...] = ("separate",),
    blocks: int = 1,
    compile_mode: str = "default",
) -> list[dict[str, object]]:
    """Times ``module.act`` for ``num_envs`` envs; one row of milliseconds per call for each of ``heads``.

    Several heads are timed on one module in ``blocks`` alternating blocks (the order flips every block),
    so load on the machine falls on both alike; each row then has ``ms_ratio_to_separate``, the median of
    the per-block ratios. When ``stacked`` or ``streams`` is among ``heads``, the weights get seeded noise
    first (the zero-initialised last layers would make the values trivial, and their ties the elites), the
    same for every head.
    """
    module, td_fn = planning_module(size, num_envs, device)
    value_diff: dict[str, float] = {}
    if set(heads) - {"separate"}:
        perturb(module.model)
    if device == "cuda":
        set_precision(precision)

    acts, compile_s, failed = {}, {}, []
    for h in heads:
        # A candidate that fails to compile or capture is a row with its error; the others are still timed.
        try:
            if h != "separate":
                value_diff[h] = value_difference(module, device, h)
            act = wrapped_act(module, variant, device, precision, h, compile_mode)
            first = timed(act, td_fn(), device)
            for _ in range(warmup - 1):
                timed(act, td_fn(), device)
        except Exception as err:
            failed.append({"variant": variant, "precision": precision, "heads": h, "error": repr(err)[:1000]})
            continue
        acts[h] = act
        compile_s[h] = round(first, 1) if variant.startswith("compiled") else None
    heads = tuple(acts)
    times: dict[str, list[float]] = {h: [] for h in heads}
    block_ms: dict[str, list[float]] = {h: [] for h in heads}
    per_block = max(1, calls // blocks)
    for b in range(blocks):
        for h in heads if b % 2 == 0 else heads[::-1]:
            block = [1e3 * timed(acts[h], td_fn(), device) for _ in range(per_block)]
            times[h] += block
            block_ms[h].append(statistics.median(block))
    hp = module.hparams
    rows = []
    for h in heads:
        extra = {}
        if kernel_table and device == "cuda":
            extra = kernels(acts[h], td_fn)
        if len(heads) > 1 and "separate" in heads:
            ratios = [a / b for a, b in zip(block_ms[h], block_ms["separate"])]
            extra["ms_ratio_to_separate"] = round(statistics.median(ratios), 3)
        if h in value_diff:
            extra["value_max_abs_diff"] = value_diff[h]
        rows.append({
            "variant": variant,
            "precision": precision,
            "heads": h,
            "compile_mode": compile_mode if variant.startswith("compiled") else None,
            "compile_s": compile_s[h],
            **extra,
            "model": size,
            "params_m": round(module.model.num_params() / 1e6, 2),
            "device": device,
            "num_envs": num_envs,
            "planner": {k: hp[k] for k in PLANNER_KEYS},
            "ms_median": round(statistics.median(times[h]), 2),
            "ms_min": round(min(times[h]), 2),
            "ms_mean": round(statistics.fmean(times[h]), 2),
            "ms_per_env_median": round(statistics.median(times[h]) / num_envs, 2),
            "calls": len(times[h]),
            "blocks": blocks,
        })  # fmt: skip
    return rows + failed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1])
    parser.add_argument("--sizes", nargs="+", default=["5M", "1M"])
    parser.add_argument("--devices", nargs="+", default=None, help="default: cpu, and cuda if there is one")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=["eager"])
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=["fp32"])
    parser.add_argument("--heads", nargs="+", choices=HEADS, default=["separate"])
    parser.add_argument("--blocks", type=int, default=1, help="alternating blocks when several --heads")
    parser.add_argument("--kernels", action="store_true", help="on CUDA, profile the plan's kernels")
    parser.add_argument(
        "--compile-mode",
        choices=COMPILE_MODES,
        default="default",
        help="torch.compile's mode for the compiled variants (one per run: they share act's code)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "tdmpc2_plan_latency.json")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    devices = args.devices or ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in devices and not torch.cuda.is_available():
        parser.error("--devices cuda: no CUDA device here")
    rows = []
    for device in devices:
        for size in args.sizes:
            for n in args.num_envs:
                for precision in args.precisions if device == "cuda" else ["fp32"]:
                    for variant in args.variants:
                        if variant in CUDA_ONLY and device != "cuda":
                            continue
                        for row in latency(
                            size, device, n, args.calls, args.warmup, variant, args.kernels, precision,
                            tuple(args.heads), args.blocks, args.compile_mode,
                        ):  # fmt: skip
                            rows.append(row)
                            print(json.dumps(row), flush=True)
    result = {
        "benchmark": "tdmpc2_plan_latency",
        "what": "ms per act() call: encode + full MPPI plan, warm-up excluded",
        "command": relative_paths(command_line()),
        "machine": machine_info(),
        "cpu_threads": torch.get_num_threads(),
        "device_names": {
            "cpu": machine_info()["cpu"],
            **({"cuda": torch.cuda.get_device_name(0)} if torch.cuda.is_available() else {}),
        },
        "results": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
