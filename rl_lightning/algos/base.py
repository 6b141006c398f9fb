"""The algorithm protocol: what every algorithm offers the data path, the trainer and the callbacks.

An algorithm is an :class:`RLModule`, a ``LightningModule`` with manual optimization and four methods:

* ``update(batch) -> TensorDict``: one full gradient step on a replay sample (losses, backward, optimizer
  steps, target update). It returns detached scalar metrics and, with prioritized replay, the new
  priorities under ``"priority"`` (``index`` and ``value``, one per sampled row; see
  :func:`priority_feedback`). It never reaches into the trainer or the data module: the data path applies
  the priorities (``training_step`` hands each output back to the round of samples it came from) and the
  training loop logs the metrics (``rl_lightning.training.feedback``).
* ``act(td) -> TensorDict``: the exploring policy for all training envs at once (writes ``"action"`` and
  any per-step keys the algorithm stores, such as an option index), called by the collector.
* ``act_eval(td) -> TensorDict``: the deterministic policy, for evaluation and export.
* ``replay_requirements() -> ReplayRequirements``: what the algorithm needs from the replay buffer. The
  data module derives its sampler from it, and a replay config that contradicts it is an error.

The data path tells the module how many frames have been collected (:meth:`RLModule.set_frames`, an
in-place fill of a device buffer, so schedules over frames need no host sync). Per-env state carried
between steps (a warm-start plan, the active option) lives in the module and is reset by the
episode-start mask of the observations (:func:`rl_lightning.algos.common.episode_start`).

For the optimization callbacks (``callbacks/``, duck-typed, see ``callbacks._protocol``):

* ``hot_paths``: the methods they may wrap (``update`` and ``act``): static shapes, no host syncs;
* ``cuda_graph_safe``: the hot paths that may be captured as CUDA graphs;
* ``compile_regions``: what ``TorchCompile`` compiles of ``update``: the methods that compute its losses, as
  pure functions of the sample (no backward, no optimizer step). Each compiles into one graph; compiling the
  whole ``update`` breaks the graph at every backward pass and optimizer step;
* ``optimizer_kwargs``: merged into every optimizer built with :meth:`RLModule.make_optimizer`
  (``fused``, ``capturable``).

Work that happens every k-th update (a delayed actor step, a target copy) is scheduled on the host by
the update count, never by a Python branch on a tensor. With every callback off the algorithm is correct.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import lightning as L
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import TensorSpec

from rl_lightning.compat import MoveHook, attached_trainer

__all__ = [
    "PRIORITY_KEY",
    "TRANSITION_KEYS",
    "IncompatibleEnvError",
    "RLModule",
    "ReplayRequirements",
    "RolloutRequirements",
    "priority_feedback",
]

#: Key of the sub-TensorDict of ``update``'s output that carries new replay priorities.
PRIORITY_KEY = "priority"

#: What a one-step transition update reads from a replay sample: ``(s, a, r, s', terminated)``.
TRANSITION_KEYS: tuple[str | tuple[str, str], ...] = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
)


class IncompatibleEnvError(ValueError):
    """The algorithm does not fit the environment (for example DQN on continuous actions)."""


@dataclass(frozen=True)
class RolloutRequirements:
    """An on-policy algorithm's rollouts (see :class:`rl_lightning.data.rollout.RolloutBuffer`): each
    collection is one rollout, prepared by the module's ``prepare_rollout(rollout [N, T])`` and consumed by
    ``epochs`` passes of ``minibatches`` shuffled minibatches, one ``update`` each, then dropped.

    Attributes:
        steps: steps per env in one rollout (a collection of ``steps × envs`` frames).
        epochs: passes over each rollout.
        minibatches: minibatches per pass.
        target_kl: a pass whose last update returned ``approx_kl`` above it ends the rollout's updates
            (``None``: never).
    """

    steps: int
    epochs: int
    minibatches: int
    target_kl: float | None = None


@dataclass(frozen=True)
class ReplayRequirements:
    """What an algorithm needs from the replay buffer (see :func:`rl_lightning.data.replay.resolve_replay`).

    Attributes:
        slice_len: ``None``: independent transitions. ``L``: sub-trajectories of ``L`` consecutive steps
            (a TorchRL row is a whole transition, so ``L`` rows carry ``L + 1`` observations; TD-MPC2 asks
            for its horizon). ``replay.slice_len`` follows it when unset and must equal it when set.
        discount: the discount of the algorithm's TD targets; n-step returns are summed with it.
        n_step: the algorithm accepts n-step transitions (it bootstraps with
            ``discount ** steps_to_next_obs``), so ``replay.n_step > 1`` is allowed.
        prioritized: the algorithm reads ``priority_weight`` and returns priorities, so
            ``replay.prioritized`` is allowed.
        extra_keys: keys that ``act`` writes beside ``"action"`` and ``update`` reads back from the
            replay (for example the active option); the data module checks that collected data has them.
        sample_keys: the keys of collected data that ``update`` reads from a sample (for example
            :data:`TRANSITION_KEYS`). The replay then stores only these, ``extra_keys`` and what the data
            path adds (n-step's ``steps_to_next_obs``): every other key (done flags, episode counters,
            info entries) would be written at every frame and gathered at every sample for nothing.
            ``None`` stores everything collected; sub-trajectory samples always do (the sampler reads the
            trajectory ids). With a ``rollout``: the keys of a prepared rollout that ``update`` reads
            (collected ones and those ``prepare_rollout`` writes); the minibatches carry only these.
        rollout: an on-policy algorithm's rollouts instead of a replay (``None``: a replay).
    """

    slice_len: int | None = None
    discount: float | None = None
    n_step: bool = False
    prioritized: bool = False
    extra_keys: tuple[str, ...] = ()
    sample_keys: tuple[str | tuple[str, ...], ...] | None = None
    rollout: RolloutRequirements | None = None

    def __post_init__(self) -> None:
        if self.rollout is not None and (self.slice_len is not None or self.n_step or self.prioritized):
            raise ValueError("rollouts go with no sub-trajectories, n-step returns or prioritized replay.")
        if self.slice_len is not None and self.slice_len < 1:
            raise ValueError(f"slice_len={self.slice_len} must be >= 1 or None.")
        if self.n_step and self.discount is None:
            raise ValueError("an algorithm that accepts n-step returns must state its discount.")
        if self.slice_len is not None and (self.n_step or self.prioritized):
            raise ValueError(
                "sub-trajectory sampling goes with neither n-step returns nor prioritized replay."
            )
        if self.slice_len is not None and self.sample_keys is not None:
            raise ValueError("sub-trajectory sampling stores every collected key: leave sample_keys unset.")


def priority_feedback(
    metrics: TensorDictBase, batch: TensorDictBase, td_error: torch.Tensor
) -> TensorDictBase:
    """Adds the new priorities ``|td_error|`` to ``update``'s output when ``batch`` is a prioritized sample.

    Args:
        metrics: the update's output (scalars).
        batch: the replay sample ``[B]``; prioritized samples carry ``index`` and ``priority_weight``.
        td_error: ``[B]`` (or ``[B, 1]``) absolute TD errors.

    Returns:
        ``metrics``, with ``metrics["priority"] = {index [B], value [B]}`` for a prioritized sample.
    """
    if "priority_weight" in batch.keys():
        index = batch.get("index")
        metrics.set(
            PRIORITY_KEY,
            TensorDict(
                {"index": index, "value": td_error.detach().reshape(index.shape)}, batch_size=index.shape
            ),
        )
    return metrics


def _follow_loaded_frames(module: RLModule, incompatible_keys: Any) -> None:
    module.follow_frames()


class RLModule(MoveHook, L.LightningModule, ABC):
    """Base of every algorithm: the protocol above plus manual-optimization helpers.

    Args:
        observation_spec: the env's observation spec (batch dims included; the last dims are the shape).
        action_spec: the env's action spec.
    """

    hot_paths: tuple[str, ...] = ("update", "act")
    cuda_graph_safe: tuple[str, ...] = ()
    #: For a hot path, the methods ``TorchCompile`` compiles in its place: the losses of ``update``, each
    #: traced into one graph (``callbacks/torch_compile.py``). A path without regions is compiled whole.
    compile_regions: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: Under DDP: some parameters get no gradient in some backward pass of ``update`` (several losses with
    #: their own optimizers, a critic-only step), so DDP must look for unused parameters.
    ddp_find_unused_parameters: bool = False
    #: State-dict names of older versions -> today's (checkpoints written before a rename still load).
    legacy_state_keys: ClassVar[dict[str, str]] = {}
    #: Name prefixes of older versions -> today's (``None``: such entries are dropped); the first matching
    #: prefix applies, after ``legacy_state_keys``.
    legacy_state_prefixes: ClassVar[dict[str, str | None]] = {}

    def __init__(self, observation_spec: TensorSpec, action_spec: TensorSpec) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.observation_spec = observation_spec
        self.action_spec = action_spec
        self.optimizer_kwargs: dict[str, Any] = {}
        # Frames seen so far, on the module's device, so schedules need no host sync.
        self.register_buffer("frames", torch.zeros((), dtype=torch.float32))
        self._frame_schedules: list[torch.nn.Module] | None = None
        self.register_load_state_dict_post_hook(_follow_loaded_frames)
        self._standalone_optimizers: list[torch.optim.Optimizer] | None = None
        self._params_cache: Any = None
        #: Optimizers to step directly, without Lightning's wrappers: set for a fit by the ``DirectSteps``
        #: callback where those would only dispatch hooks nobody implements (``callbacks/direct_steps.py``).
        self.direct_optimizers: list[Any] | None = None

    # ------------------------------------------------------------------ protocol
    @abstractmethod
    def update(self, batch: TensorDictBase) -> TensorDictBase:
        """One gradient step on a replay sample; returns detached scalar metrics (and priorities)."""

    @abstractmethod
    def act(self, td: TensorDictBase) -> TensorDictBase:
        """The exploring policy for the ``[N]`` training envs; writes ``"action"`` into ``td``."""

    @abstractmethod
    def act_eval(self, td: TensorDictBase) -> TensorDictBase:
        """The deterministic policy for any number of envs ``[N]``; writes ``"action"`` into ``td``."""

    @abstractmethod
    def replay_requirements(self) -> ReplayRequirements:
        """What this algorithm needs from the replay buffer."""

    def export_policy(self) -> torch.nn.Module:
        """The deterministic policy as a plain module, for ``export``: ``observation -> action``.

        The module maps a float tensor ``[N, *obs_shape]`` to the actions ``act_eval`` takes for those
        observations (in the env's units), with no TensorDict, no per-env state and no randomness, so that
        TorchScript and ONNX can hold it and it runs without the framework.

        Raises:
            NotImplementedError: the algorithm's deterministic policy is not a function of the observation
                alone (it says why).
        """
        raise NotImplementedError(f"{type(self).__name__} does not provide an exportable policy.")

    def snapshot_policy(self) -> torch.nn.Module:
        """A frozen copy's policy to play against (hockey's self-play): ``observation -> action`` as
        :meth:`export_policy` gives it. An algorithm whose deterministic policy is no function of the
        observation alone overrides it with the closest one that is (TD-MPC2 planning: its policy prior).
        """
        return self.export_policy()

    def set_frames(self, frames: int) -> None:
        """Called by the data path after each collection (an in-place fill: no sync, graph-safe).

        Schedules over frames (submodules with a ``follow_frames(frames)`` method, such as
        ``LinearSchedule``) update their value here and when a state dict is loaded, not in the hot paths.
        """
        self.frames.fill_(float(frames))
        self.follow_frames()

    def follow_frames(self) -> None:
        """Brings every schedule over frames up to ``self.frames``."""
        if self._frame_schedules is None:
            found = [m for m in self.modules() if m is not self and hasattr(m, "follow_frames")]
            self._frame_schedules = found
        for schedule in self._frame_schedules:
            schedule.follow_frames(self.frames)

    # ------------------------------------------------------------------ helpers
    @property
    def obs_shape(self) -> torch.Size:
        """Shape of one observation (without the env batch dimension)."""
        return self.observation_spec["observation"].shape[1:]

    def optimizer(self, index: int = 0) -> torch.optim.Optimizer:
        """The ``index``-th optimizer: Lightning's wrapper under a Trainer, else the module's own.

        ``direct_optimizers``, when a callback set them (``DirectSteps``: the wrappers would only dispatch
        hooks nobody implements), come first, and :meth:`backward_loss` is then a plain backward. Outside a
        Trainer (unit tests, hand-written loops, benchmarks) the optimizers come from
        ``configure_optimizers`` once and are kept on the module.
        """
        if self.direct_optimizers is not None:
            return self.direct_optimizers[index]
        if attached_trainer(self) is not None:
            opts = self.optimizers()
            return opts[index] if isinstance(opts, list) else opts
        if self._standalone_optimizers is None:
            opts = self.configure_optimizers()
            self._standalone_optimizers = list(opts) if isinstance(opts, list | tuple) else [opts]
        return self._standalone_optimizers[index]

    def _param_lists(self) -> Any:
        """What :meth:`_collect_params` returns, walked once and kept until the module moves (``on_move``).

        Walking the modules for their parameters costs more than a small network's update on a CPU, so the
        hot paths step, clip and copy cached lists of the leaves.
        """
        if self._params_cache is None:
            self._params_cache = self._collect_params()
        return self._params_cache

    def _collect_params(self) -> Any:
        """The parameter lists the hot paths use (optimizer groups, clipping, target copies), by name."""
        raise NotImplementedError(f"{type(self).__name__} keeps no parameter lists.")

    def on_move(self) -> None:
        self._params_cache = None  # moved or cast: new leaves for the buffers, maybe for the parameters

    def clear_grads(self, *optimizers: Any) -> None:
        """Clears the optimizers' gradients before a backward: dropped on a CPU, zeroed in place on a GPU.

        Dropped (``set_to_none``), the backward hands its gradient tensors over instead of adding them into
        zeroed ones: 3% of a DQN or a SAC update on a CPU (CartPole DQN 1096 -> 1062 us, Pendulum SAC 9.50 ->
        9.19 ms, medians alternating in one process). On a GPU they stay where they are: a CUDA-graphed
        update reads and writes them at the addresses it captured (``CudaGraphs``). Both give the same bits:
        every parameter of an optimizer an update steps gets a gradient in that update
        (``tests/algos/test_clear_grads.py``), so Adam never skips a parameter whose zeroed gradient it would
        have stepped.
        """
        set_to_none = self.device.type != "cuda"
        for opt in optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def backward_loss(self, loss: torch.Tensor) -> None:
        """``manual_backward`` under a Trainer (precision plugins, grad scaling, hooks), plain backward
        otherwise or while ``direct_optimizers`` are set."""
        if self.direct_optimizers is None and attached_trainer(self) is not None:
            self.manual_backward(loss)
        else:
            loss.backward()

    def make_optimizer(
        self, params: Iterable[Any], lr: float, kind: str = "adam", **kwargs: Any
    ) -> torch.optim.Optimizer:
        """``Adam`` (or, with ``kind="rmsprop"``, the DQN papers' RMSProp: centered, squared-gradient
        momentum 0.95, ε 0.01, as Mnih et al. 2015 and the MinAtar paper train) with the callbacks'
        ``optimizer_kwargs`` merged in.

        Unless a callback asks for the fused kernel, the multi-tensor (``foreach``) implementation is used
        on every device: torch picks it only for CUDA tensors by default, and on a CPU the per-tensor loop
        costs about twice as much for the small networks of RL. RMSProp has no fused kernel: it keeps
        ``foreach`` (the ``FusedOptimizer`` callback warns that it did not come out fused).
        """
        if kind not in ("adam", "rmsprop"):
            raise ValueError(f"optimizer={kind!r}: choose adam or rmsprop.")
        kwargs = {**kwargs, **self.optimizer_kwargs}
        if kind == "rmsprop":
            kwargs.pop("fused", None)
            kwargs = {"alpha": 0.95, "eps": 0.01, "centered": True, **kwargs}
        if not kwargs.get("fused"):
            kwargs.setdefault("foreach", True)
        if not isinstance(lr, torch.Tensor) and kwargs.get("capturable"):
            lr = torch.tensor(lr)
        optimizer = torch.optim.RMSprop if kind == "rmsprop" else torch.optim.Adam
        return optimizer(params, lr=lr, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        # A copy in another process (a collector's worker) gets the class's hot paths: the optimization
        # callbacks' wrappers (compiled functions, CUDA graphs) belong to this process.
        # It gets none of this process's optimizers either.
        state = super().__getstate__()
        for name in (*self.hot_paths, *(r for regions in self.compile_regions.values() for r in regions)):
            state.pop(name, None)
        state["direct_optimizers"] = state["_params_cache"] = None
        return state

    # ------------------------------------------------------------------ Lightning hooks
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Renames the state-dict entries of older versions (``legacy_state_keys``, then
        ``legacy_state_prefixes``) before they load."""
        state = checkpoint.get("state_dict", {})
        for old, new in self.legacy_state_keys.items():
            if old in state and new not in state:
                state[new] = state.pop(old)
        for key in list(state):
            prefix = next((p for p in self.legacy_state_prefixes if key.startswith(p)), None)
            if prefix is not None:
                value = state.pop(key)
                if (new := self.legacy_state_prefixes[prefix]) is not None:
                    state[new + key[len(prefix) :]] = value

    def prepare_sample(self, sample: TensorDictBase) -> TensorDictBase:
        """Host-side work on each replay sample just before its ``update`` (here: none).

        Called one sample at a time, as the data path draws them, so a Python counter here follows the
        updates (the delayed actor of TD3, DDPG and AC-IQN marks samples critic-only). It runs outside
        ``update``, so it may branch in Python without breaking a compiled or CUDA-graphed ``update``.
        """
        return sample

    def training_step(self, batch: Any, batch_idx: int) -> dict[str, Any]:
        """One update per replay sample of the batch.

        ``batch`` is a replay sample (a ``TensorDict``: one update) or a round of samples from the data
        path (an iterable of them with a ``feedback(output)`` method that applies each update's priorities
        before the next sample is drawn). Returns ``{"metrics": the last update's output, "updates": how
        many were done}``, which the callbacks receive as ``outputs`` (the update feedback logs the
        metrics; throughput monitors count the updates).
        """
        if isinstance(batch, TensorDictBase):
            return {"metrics": self.update(self.prepare_sample(batch)), "updates": 1}
        out, n = None, 0
        for sample in batch:
            out = self.update(self.prepare_sample(sample))
            batch.feedback(out)
            n += 1
        return {"metrics": out, "updates": n}
