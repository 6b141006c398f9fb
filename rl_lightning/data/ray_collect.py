"""Collection on a Ray cluster (``collect.backend=ray``): TorchRL's ``RayCollector``, an optional extra.

Ray is not a dependency of the project (``pip install 'rl_lightning[ray]'``); nothing here imports it
before a run asks for it. The data module chooses this builder in ``start_collection`` and hands it what
it hands TorchRL's multi-process collectors: one env constructor per worker and the module as a
:class:`~torch.nn.Module` policy that rebuilds itself in each worker. Each Ray actor runs a TorchRL
``Collector`` over its ``env.num_envs`` envs and acts on its CPU; the weights reach the actors before
every collection through TorchRL's Ray weight sync (a gloo group between this process and the actors).
"""

from __future__ import annotations

import logging
import socket
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["RAY_MISSING", "check_ray_installed", "make_ray_collector"]

#: The one line a run that asks for Ray prints when Ray is not installed.
RAY_MISSING = "collect.backend=ray needs Ray: pip install 'rl_lightning[ray]' (or pip install ray)."
#: Trajectory ids are int32 in TorchRL's collectors.
_MAX_TRAJ_ID = 2**31 - 1


def check_ray_installed() -> None:
    """Raises ``ValueError`` (:data:`RAY_MISSING`) when ``import ray`` fails."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise ValueError(RAY_MISSING) from None


def _start_ray(address: str | None, workers: int) -> bool:
    """Starts a local Ray runtime (``address`` None) or joins the cluster at ``address``.

    Returns:
        True when this call initialized Ray (the collector then shuts it down again), False when the
        process was connected to a Ray runtime already (a notebook's, say): that one is left alone.

    Raises:
        ValueError: the cluster has fewer CPUs than ``workers`` (the actors would wait for them forever).
    """
    import ray

    if ray.is_initialized():
        return False
    quiet = {"log_to_driver": False, "logging_level": logging.ERROR}
    if address is None:
        # One logical CPU per collector actor and nothing else: a small, fast start without a dashboard.
        ray.init(address="local", num_cpus=workers, include_dashboard=False, **quiet)
        return True
    _check_reachable(address)
    try:
        ray.init(address=address, **quiet)
    except ConnectionError as err:
        raise ValueError(
            f"collect.ray_address={address}: {str(err).splitlines()[0]} Start one with `ray start --head`, "
            "or set collect.ray_address=null for a local Ray."
        ) from None
    cpus = ray.cluster_resources().get("CPU", 0)
    if cpus < workers:
        ray.shutdown()
        raise ValueError(
            f"collect.workers={workers} needs {workers} CPUs in the Ray cluster at {address}, which has "
            f"{cpus:g}; lower collect.workers or add nodes (ray start --address=...)."
        )
    return True


def _check_reachable(address: str) -> None:
    """Fails at once for a ``HOST:PORT`` nobody listens on (``ray.init`` would retry for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", or a Ray Client address: ray.init reports those quickly
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as err:
        raise ValueError(
            f"collect.ray_address={address}: no Ray cluster answers there ({err}); start its head with "
            "`ray start --head` and pass the address it prints."
        ) from None


def _collector_class() -> type:
    """The collector class, defined on first use: importing TorchRL's Ray module imports parts of Ray."""
    from torchrl.collectors.distributed import RayCollector

    class OwningRayCollector(RayCollector):
        """``RayCollector`` whose ``shutdown`` also stops the Ray runtime its builder started (or leaves
        the cluster it joined), so that no Ray process outlives the fit."""

        owns_ray = False

        def shutdown(self, timeout: float | None = None, shutdown_ray: bool = False) -> None:
            super().shutdown(timeout=timeout, shutdown_ray=shutdown_ray or self.owns_ray)

    return OwningRayCollector


def make_ray_collector(
    env_makers: list[Callable[[], Any]],
    policy: torch.nn.Module,
    *,
    frames_per_worker: int,
    sync: bool,
    random_frames_per_worker: int,
    address: str | None,
    traj_start: int | None,
    num_envs: int,
    remaining_frames: int,
    devices: dict[str, torch.device],
) -> Any:
    """TorchRL's ``RayCollector`` over ``len(env_makers)`` Ray actors, one TorchRL ``Collector`` each.

    Args:
        env_makers: one env constructor per actor (their seeds apart).
        policy: the acting policy; pickled into every actor (its ``__reduce__`` decides how).
        frames_per_worker: frames each actor collects per batch.
        sync: every actor contributes to each batch (``[workers, envs, T]``), else the first ready one's.
        random_frames_per_worker: random-action frames each actor collects first (a multiple of
            ``frames_per_worker``; 0 for none).
        address: ``None`` starts a local Ray; ``"auto"`` or ``HOST:PORT`` joins a running cluster.
        traj_start: with trajectory ids (slice sampling), the first free id: actor ``w`` numbers its
            trajectories from ``traj_start + w * stride``, each actor in its own range (``None``: no ids).
        num_envs: envs per actor.
        remaining_frames: frames left in the run's budget, which bounds the trajectories of an actor.
        devices: TorchRL's device arguments (``env_device``, ``storing_device``, ``policy_device``), from
            the run's device copies (:meth:`~rl_lightning.data.transfer.DeviceCopies.collector_devices`):
            all on the host, the batches crossing to the replay in this process.

    Returns:
        The collector; its ``shutdown`` stops the actors and the Ray runtime started here.
    """
    workers = len(env_makers)
    ranges = None
    if traj_start is not None:
        ranges = _traj_ranges(traj_start, workers, num_envs, frames_per_worker, remaining_frames)
    owns_ray = _start_ray(address, workers)
    try:
        collector_kwargs: dict[str, Any] = {"trust_policy": True}
        if ranges is not None:
            collector_kwargs["track_traj_ids"] = True
        cls = _collector_class()
        with warnings.catch_warnings():
            # Each actor counts its own random frames, as in TorchRL's multi-process collectors.
            warnings.filterwarnings("ignore", message="async distributed data collection with init_random")
            collector = cls(
                env_makers,
                policy,
                frames_per_batch=frames_per_worker * workers if sync else frames_per_worker,
                total_frames=sys.maxsize,  # the data module keeps the budget
                sync=sync,
                init_random_frames=random_frames_per_worker * workers,
                collector_kwargs=collector_kwargs,
                # The actors act on their CPU whatever device the module trains on: Ray gives them no GPU.
                remote_configs={"num_cpus": 1},
                **devices,
                trust_policy=True,
            )
        collector.owns_ray = owns_ray
        if ranges is not None:
            collector.load_state_dict(ranges)
    except BaseException:
        if owns_ray:
            import ray

            ray.shutdown()
        raise
    return collector


def _traj_ranges(
    start: int, workers: int, num_envs: int, frames_per_worker: int, remaining_frames: int
) -> list[dict]:
    """Per-actor collector states that give every actor its own range of trajectory ids.

    Loading the state opens a trajectory per env, and every finished episode one more (at most one per
    frame): an actor opens fewer than ``stride`` in this fit, even if it collected the whole remaining
    budget and the batches it may collect ahead of it.
    """
    stride = remaining_frames + 3 * frames_per_worker + 2 * num_envs + 1
    if start + workers * stride > _MAX_TRAJ_ID:
        raise ValueError(
            f"collect.backend=ray: {workers} workers x {remaining_frames} frames overflow TorchRL's int32 "
            "trajectory ids; lower total_frames or collect.workers."
        )
    return [
        {"frames": 0, "iter": 0, "traj_pool": {"traj_id": torch.tensor(start + w * stride, dtype=torch.int)}}
        for w in range(workers)
    ]
