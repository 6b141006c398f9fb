"""CUDA-graphed hot paths draw fresh random numbers at every replay, with and without compile first.

A CUDA graph records kernels, not Python: a random op whose seed or offset were read once at capture would
replay the same numbers forever, and learning would degrade without an error (TorchRL's compiled and
graphed stochastic policies did exactly that, pytorch/rl#3002). The equivalence tests cannot see it: they
compare runs with ``fallback_random`` on, which draws with eager's generator. These run as training does,
Inductor's own random numbers included, and check for each path that draws:

- TD-MPC2's plan (``act``): two plans from the same observation and warm start sample different
  trajectories, and over many replays the spread of the executed actions and of the plans' means (the
  MPPI samples' refit) is the spread eager plans have;
- SAC's actor (``act``): replays sample different actions, with eager's spread;
- Rainbow's noisy layers: each replayed ``update`` resamples their noise, with eager's scale.

``act`` is wrapped as ``TorchCompile`` (its defaults) and ``CudaGraphs`` wrap it, with the callbacks' own
``GraphedPath``; ``update`` runs under the real callbacks in a ``lightning.Trainer``. Each wrapped path
also shows that it acted: a graph captured, and with compile, dynamo's graphs counted.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from helpers.batches import transition_data
from helpers.fit import FixedBatches
from tensordict import TensorDict, TensorDictBase

from callbacks import CudaGraphs, TorchCompile
from callbacks._graphed_path import GraphedPath
from rl_lightning.cli import compose
from rl_lightning.cli.run import build_module, env_config
from rl_lightning.nn.noisy import NoisyLinear

pytestmark = pytest.mark.gpu

VARIANTS = ("graphed", "compiled_graphed")
REPLAYS = 64
#: The spread of ``REPLAYS`` draws is estimated within about 10% (one standard error, per entry, fewer
#: averaged over the entries); a frozen draw has none, a draw repeated across MPPI iterations another one.
SPREAD_RATIO = (0.7, 1.43)


def build(overrides: list[str]) -> torch.nn.Module:
    cfg = compose([*overrides, "device=cuda", "logger=none"])
    torch.manual_seed(0)
    return build_module(cfg, env_config(cfg)).to("cuda")


def wrapped(fn, variant: str) -> GraphedPath:
    """``fn`` as ``[TorchCompile(), CudaGraphs(warmup=3)]`` leave a hot path (``compiled_graphed``), or as
    ``CudaGraphs`` alone (``graphed``)."""
    if variant == "compiled_graphed":
        torch._dynamo.reset()  # a fresh compile, not one left by another test within the recompile limit
        torch._dynamo.utils.counters.clear()
        fn = torch.compile(fn, mode="default", fullgraph=False, dynamic=False)
    return GraphedPath(fn, "act", warmup=3, device=torch.device("cuda"), step_counter=lambda: 0,
                       add_steps=lambda n: None)  # fmt: skip


def assert_acted(path: GraphedPath, variant: str) -> None:
    assert path.graphs_captured == 1 and path.eager_fallbacks == 0
    if variant == "compiled_graphed":
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1


def draws(act, td: TensorDictBase, n: int, before=None, after=None) -> torch.Tensor:
    """``[n, ...]``: the action of ``n`` calls of ``act`` on the same input, each after ``before()``, with
    ``after()`` (if given) stacked beside it."""
    out = []
    for _ in range(n):
        if before is not None:
            before()
        action = act(td.clone())["action"].flatten()
        out.append(torch.cat([action, after().flatten()]) if after is not None else action.clone())
    return torch.stack(out)


def assert_fresh_with_eagers_spread(eager: torch.Tensor, graphed: torch.Tensor) -> None:
    # Every replay differs from the one before it: nothing was frozen at capture.
    assert (graphed[1:] != graphed[:-1]).any(dim=1).all()
    spread = graphed.std(0).mean() / eager.std(0).mean()
    assert SPREAD_RATIO[0] < spread < SPREAD_RATIO[1], f"replays' spread is {spread:.2f}x eager's"


@pytest.mark.parametrize("variant", VARIANTS)
def test_tdmpc2_plans_sample_fresh_trajectories_at_every_replay(variant: str) -> None:
    module = build(["+experiment=tdmpc2_hockey_cpu", "env.num_envs=2"])
    with torch.no_grad():  # weights off their zero-initialised heads: values without ties, real elites
        g = torch.Generator(device="cuda").manual_seed(0)
        for p in module.model.parameters():
            p.add_(0.02 * torch.randn(p.shape, device="cuda", generator=g))
    module.train()
    obs = torch.randn(2, module.obs_shape[0], device="cuda")
    steps = torch.ones(2, 1, dtype=torch.int64, device="cuda")  # not an episode's first step
    td = TensorDict({"observation": obs, "step_count": steps}, [2])
    warm_start = module.planner.prev_mean
    warm_start.normal_(0.0, 0.3).clamp_(-1, 1)
    start = warm_start.clone()

    def from_start() -> None:
        warm_start.copy_(start)

    def plan_mean() -> torch.Tensor:
        return warm_start

    torch.manual_seed(1)
    eager = draws(module.act, td, REPLAYS, from_start, plan_mean)
    act = wrapped(module.act, variant)
    draws(act, td, 4, from_start)  # 3 warm-up calls and the capture
    graphed = draws(act, td, REPLAYS, from_start, plan_mean)
    assert_acted(act, variant)
    actions = 2 * module.actions.action_dim
    # Two plans from one observation and warm start: different actions and different plans.
    assert (graphed[1:, :actions] != graphed[:-1, :actions]).any(dim=1).all()
    assert (graphed[1:, actions:] != graphed[:-1, actions:]).any(dim=1).all()
    assert_fresh_with_eagers_spread(eager[:, :actions], graphed[:, :actions])
    assert_fresh_with_eagers_spread(eager[:, actions:], graphed[:, actions:])


@pytest.mark.parametrize("variant", VARIANTS)
def test_sac_actor_samples_fresh_actions_at_every_replay(variant: str) -> None:
    module = build(["+experiment=sac_pendulum", "algo.hidden_sizes=[32,32]"])
    td = TensorDict({"observation": torch.randn(4, module.obs_shape[0], device="cuda")}, [4])
    torch.manual_seed(1)
    eager = draws(module.act, td, REPLAYS)
    act = wrapped(module.act, variant)
    draws(act, td, 4)
    graphed = draws(act, td, REPLAYS)
    assert_acted(act, variant)
    assert_fresh_with_eagers_spread(eager, graphed)


class NoiseRecorder(L.Callback):
    """The noise of every noisy layer after each update (each ``update`` resamples it first)."""

    def __init__(self) -> None:
        self.noise: list[torch.Tensor] = []

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args) -> None:
        layers = [m for m in pl_module.online.modules() if isinstance(m, NoisyLinear)]
        self.noise.append(torch.cat([m.weight_epsilon.flatten() for m in layers]).cpu())


UPDATES = 24


def rainbow_noise(callbacks: list) -> torch.Tensor:
    """``[UPDATES, noise]``: Rainbow's noise after each of ``UPDATES`` updates with ``callbacks``."""
    module = build(["+experiment=rainbow_cartpole", "algo.hidden_sizes=[32,32]"])
    batches, _ = transition_data(module, UPDATES, seed=11, reward=torch.rand)
    recorder = NoiseRecorder()
    trainer = L.Trainer(
        accelerator="gpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[*callbacks, recorder],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=FixedBatches(batches))
    return torch.stack(recorder.noise)


@pytest.mark.parametrize("variant", VARIANTS)
def test_noisy_layers_resample_their_noise_at_every_replayed_update(variant: str) -> None:
    torch.manual_seed(1)
    eager = rainbow_noise([])
    graphs = CudaGraphs(warmup=2, paths=["update"])
    compiled = [TorchCompile(paths=["update"])] if variant == "compiled_graphed" else []
    if compiled:
        torch._dynamo.reset()
    noise = rainbow_noise([*compiled, graphs])
    assert graphs.graphs_captured == 1
    replayed = noise[3:]  # 2 warm-up updates and the capture, then replays
    # Each replay resamples: no two updates share their noise.
    assert len({tuple(n.tolist()) for n in replayed}) == len(replayed)
    # Factorized noise f(x) f(y), f(x) = sign(x) sqrt|x|: E[f(x)^2 f(y)^2] = E|x| E|y| = 2/pi, as eager's.
    scale = replayed.pow(2).mean() / eager.pow(2).mean()
    assert SPREAD_RATIO[0] < scale < SPREAD_RATIO[1]
