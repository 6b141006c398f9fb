"""Parts every algorithm family shares: action scaling, Polyak targets, schedules, per-env state, the
delayed actor's schedule, and the deterministic policies ``RLModule.export_policy``
returns.

The tensor parts are device-side and free of host syncs, so they can sit inside compiled and CUDA-graphed
hot paths; :func:`mark_critic_only` works on the host, between updates.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import TypeVar

import torch
from tensordict import TensorDictBase
from torch import Tensor, nn
from torchrl.data import Bounded, TensorSpec

from rl_lightning.algos.base import IncompatibleEnvError
from rl_lightning.compat import foreach_lerp_, foreach_mul_, foreach_norm

__all__ = [
    "CRITIC_ONLY",
    "ActionScaler",
    "GreedyPolicy",
    "LinearSchedule",
    "PerEnvState",
    "ScaledActorPolicy",
    "bootstrapped_targets",
    "clip_grad_norm",
    "episode_start",
    "mark_critic_only",
    "polyak_update",
    "weighted_mean",
    "without_grad",
]

_F = TypeVar("_F", bound=Callable)


def without_grad(fn: _F) -> _F:
    """``torch.no_grad()`` for an acting hot path, entered only where gradients are on.

    The collector and the evaluation already run the policy without gradients; entering ``no_grad`` again
    costs a context object and two grad-mode switches, about 5 us of a 100 us SAC ``act`` on a CPU.
    """

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class ActionScaler(nn.Module):
    """Affine map between a policy's ``[-1, 1]`` actions and a bounded env's ``[low, high]``.

    Args:
        action_spec: the env's action spec; must be ``Bounded`` with finite bounds, ``high > low``.
        who: the algorithm's name, for the error message.

    Buffers:
        scale: ``(high - low) / 2``, ``[A]``.
        bias: ``(high + low) / 2``, ``[A]``.
    """

    scale: Tensor
    bias: Tensor

    def __init__(self, action_spec: TensorSpec, who: str) -> None:
        super().__init__()
        if not isinstance(action_spec, Bounded):
            raise IncompatibleEnvError(
                f"{who} needs bounded continuous actions, but the env's actions are "
                f"{type(action_spec).__name__}; use a continuous env "
                "(e.g. Pendulum-v1 or HockeyVsOpponent-v0)."
            )
        low = action_spec.space.low.reshape(-1, *action_spec.shape[-1:])[0].float()
        high = action_spec.space.high.reshape(-1, *action_spec.shape[-1:])[0].float()
        if not (torch.isfinite(low).all() and torch.isfinite(high).all() and (high > low).all()):
            raise IncompatibleEnvError(f"{who} needs finite action bounds with high > low.")
        self.register_buffer("scale", (high - low) / 2)
        self.register_buffer("bias", (high + low) / 2)

    @property
    def action_dim(self) -> int:
        return int(self.scale.numel())

    def to_env(self, action: Tensor) -> Tensor:
        """``[..., A]`` in ``[-1, 1]`` -> the env's bounds."""
        return torch.addcmul(self.bias, action, self.scale)

    def from_env(self, action: Tensor) -> Tensor:
        """The env's bounds -> ``[-1, 1]`` (clamped)."""
        return ((action - self.bias) / self.scale).clamp(-1, 1)


class GreedyPolicy(nn.Module):
    """``observation [N, *obs_shape] -> argmax_a scores(s)_a [N]``, for export.

    The deterministic policy of every algorithm that acts greedily on per-action scores: DQN's Q-values,
    the distributional family's (distorted) expected returns, discrete SAC's actor logits.

    Args:
        scores: ``[N, *obs_shape] -> [N, n_actions]``, exactly what the algorithm's ``act_eval`` maximises.
    """

    def __init__(self, scores: nn.Module) -> None:
        super().__init__()
        self.scores = scores

    def forward(self, observation: Tensor) -> Tensor:
        return self.scores(observation.float()).argmax(-1)


class ScaledActorPolicy(nn.Module):
    """``observation [N, *obs_shape] -> actions.to_env(actor(s)) [N, A]``, for export.

    The deterministic policy of the actor-critics: an actor whose action lies in ``[-1, 1]``, mapped to
    the env's bounds as ``act_eval`` maps it.

    Args:
        actor: ``[N, *obs_shape] -> [N, A]`` in ``[-1, 1]`` (the deterministic action ``act_eval`` takes).
        actions: the algorithm's :class:`ActionScaler`.
    """

    def __init__(self, actor: nn.Module, actions: ActionScaler) -> None:
        super().__init__()
        self.actor = actor
        self.actions = actions

    def forward(self, observation: Tensor) -> Tensor:
        return self.actions.to_env(self.actor(observation.float()))


@torch.no_grad()
def polyak_update(targets: Iterable[Tensor], sources: Iterable[Tensor], tau: float | Tensor) -> None:
    """``target <- target + tau * (source - target)`` for every pair, as one fused ``lerp_``.

    ``tau=1`` copies (a hard update); a tensor ``tau`` (``0.`` or ``1.``, chosen on the device) lets a hard
    update every k steps run without a Python branch. On a CPU, outside compilation, reading such a tensor
    costs nothing, so a hard update that is not due skips the pass over the parameters (about 18 us of a
    DQN CartPole update).
    """
    targets = list(targets)
    sources = [s.detach() for s in sources]
    if isinstance(tau, Tensor):
        if tau.device.type != "cpu" or torch.compiler.is_compiling():
            for t, s in zip(targets, sources):
                t.lerp_(s, tau)
            return
        tau = float(tau)
        if tau == 0.0:
            return
    foreach_lerp_(targets, sources, tau)


@torch.no_grad()
def clip_grad_norm(params: Iterable[Tensor], max_norm: float) -> Tensor:
    """Scales the gradients of ``params`` to a total 2-norm of at most ``max_norm``; returns the norm
    before clipping (a 0-dim tensor, no host sync).

    The arithmetic of ``torch.nn.utils.clip_grad_norm_`` (the same kernels in the same order, so the same
    bits) for parameters on one device with one dtype, without its per-call grouping and dispatch: about
    30 us less on a CPU, a few percent of a small network's update. Other parameter sets go to torch's.
    """
    with_grad = [p for p in params if p.grad is not None]
    grads = [p.grad for p in with_grad]
    one_kind = all(g.device == grads[0].device and g.dtype == grads[0].dtype for g in grads)
    if not grads or not one_kind or any(g.is_sparse for g in grads):
        return nn.utils.clip_grad_norm_(with_grad, max_norm)
    total = torch.linalg.vector_norm(torch.stack(foreach_norm(grads)))
    foreach_mul_(grads, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total


def bootstrapped_targets(
    reward: Tensor, terminated: Tensor, bootstrap: Tensor, gamma: float, steps: Tensor | None = None
) -> Tensor:
    """TD(0) targets ``r + gamma ** steps * (1 - terminated) * bootstrap``, ``[B]``.

    Args:
        reward: ``[B]`` (n-step: the discounted sum of the window's rewards).
        terminated: ``[B]`` bool; no bootstrap past a terminal state (a truncation still bootstraps).
        bootstrap: ``[B]`` value of the next observation.
        gamma: discount.
        steps: ``[B]`` steps to the next observation (n-step windows); ``None`` means one.
    """
    discount = gamma if steps is None else gamma ** steps.to(bootstrap.dtype)
    return reward + discount * (~terminated).to(bootstrap.dtype) * bootstrap


def weighted_mean(x: Tensor, weights: Tensor | None) -> Tensor:
    """The mean of the per-sample losses ``x [B]``; for a prioritized sample ``mean(w * x)`` with its
    importance-sampling weights ``w`` (any shape of ``B`` elements).

    The one prioritized-replay reduction of every algorithm, the papers' choice: Schaul et al. (2016),
    Algorithm 1, normalize ``w_j = (N P(j))^-beta`` by ``max_i w_i`` and sum ``w_j delta_j grad Q`` over the
    minibatch (a mean, with the batch size folded into the step size); Dopamine's Rainbow minimizes
    ``mean(w * L)`` with ``w`` divided by its batch maximum. The weights arrive max-normalized:
    ``data/per.py`` returns ``(p_i / min p) ** -beta``. With ``w <= 1`` they only scale updates down, and a
    batch of small weights (high-priority samples) takes a smaller step, which is the correction; TorchRL's
    losses divide by ``sum(w)`` instead (self-normalized), which undoes that scale for the batch as a whole.
    """
    return x.mean() if weights is None else (x * weights.reshape(x.shape).to(x.dtype)).mean()


class LinearSchedule(nn.Module):
    """A value that moves linearly from ``start`` to ``end`` over ``duration`` frames, then stays.

    Computed on the device from a frame count buffer (``RLModule.frames``), so reading it needs no sync.
    ``value`` holds it at the frames last followed: ``RLModule.set_frames`` (once per collection) and a
    checkpoint load call :meth:`follow_frames`, so the hot paths read ``value`` instead of computing it at
    every step (eight small kernels, about a third of DQN's acting time on a CPU).
    """

    bounds: Tensor
    value: Tensor

    def __init__(self, start: float, end: float, duration: int) -> None:
        super().__init__()
        if duration < 1:
            raise ValueError(f"schedule duration={duration} must be >= 1 frame.")
        self.duration = duration
        self.register_buffer("bounds", torch.tensor([start, end]))
        self.register_buffer("value", torch.tensor(float(start)), persistent=False)

    def forward(self, frames: Tensor) -> Tensor:
        frac = (frames / float(self.duration)).clamp(max=1.0)
        return self.bounds[0] + (self.bounds[1] - self.bounds[0]) * frac

    def follow_frames(self, frames: Tensor) -> None:
        """Sets ``value`` to the schedule at ``frames`` in place (a CUDA graph reading it sees it)."""
        self.value.copy_(self(frames))


#: Batch key that makes a delayed actor's ``update`` skip the actor step (its presence counts, not its value).
CRITIC_ONLY = "critic_only"


def mark_critic_only(batch: TensorDictBase, update_number: int, policy_delay: int) -> TensorDictBase:
    """The delayed actor's schedule for update ``update_number`` (counted from 1), on the host.

    Every ``policy_delay``-th update steps the actor: ``batch`` is returned as it is. The others get a
    shallow copy carrying :data:`CRITIC_ONLY`, an empty ``[B, 0]`` tensor: it changes the batch's signature
    (its keys), so a CUDA-graphed ``update`` has a graph per signature (and one compiled whole a variant per
    phase), at no memory or kernel cost. The compiled losses read the batch without it.
    """
    if update_number % policy_delay == 0:
        return batch
    marked = batch.copy()
    marked.set(CRITIC_ONLY, batch.get("observation").new_empty((*batch.batch_size, 0)))
    return marked


def episode_start(td: TensorDictBase) -> Tensor | None:
    """Bool ``[N]``, True at an episode's first step: ``is_init`` if present, else ``step_count == 0``.

    ``None`` when the observations carry neither (then every step is treated as mid-episode).
    """
    is_init = td.get("is_init", None)
    if is_init is not None:
        return is_init.reshape(-1).bool()
    step_count = td.get("step_count", None)
    return None if step_count is None else step_count.reshape(-1) == 0


class PerEnvState(nn.Module):
    """State carried between steps for each of ``num_envs`` envs, reset where an episode starts.

    The reset is a ``torch.where`` over the episode-start mask: no Python loop over envs, no sync.

    Args:
        num_envs: how many envs act in one call.
        shape: the state's shape per env.
        fill: the value a new episode starts from.
        dtype: the state's dtype.

    Buffers:
        value: ``[num_envs, *shape]``.
    """

    value: Tensor

    def __init__(
        self,
        num_envs: int,
        shape: tuple[int, ...] = (),
        fill: float = 0.0,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if num_envs < 1:
            raise ValueError(f"num_envs={num_envs} must be >= 1.")
        self.num_envs = num_envs
        self.fill = fill
        self.register_buffer("value", torch.full((num_envs, *shape), fill, dtype=dtype))

    def reset(self, mask: Tensor | None = None) -> Tensor:
        """Sets the state of the envs where ``mask`` ([N] bool) is True back to ``fill``; all if ``None``.

        Returns:
            The state after the reset.
        """
        if mask is None:
            self.value.fill_(self.fill)
        else:
            mask = mask.reshape(self.num_envs, *([1] * (self.value.dim() - 1))).to(torch.bool)
            self.value.copy_(torch.where(mask, torch.full_like(self.value, self.fill), self.value))
        return self.value

    def set(self, value: Tensor) -> None:
        """Replaces the state in place (keeps the buffer, so CUDA graphs see the new value)."""
        self.value.copy_(value)
