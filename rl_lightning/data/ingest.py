"""Ingestion: a collected batch becomes rows of the replay buffer, and its finished episodes statistics.

What happens to every collection between the collector and the replay: finished episodes are counted
(return, length), trajectory ids of worker collectors are shifted past those of a resumed buffer, image
observations become frame serials (a :class:`~rl_lightning.data.frames.FrameReplay` stores each frame
once), n-step returns are folded in, the keys the algorithm declared are checked once, and the entries the
replay stores are cut into one row per frame and copied into the replay (through the run's device copies: a
GPU replay fed from the CPU envs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from rl_lightning.algos.base import ReplayRequirements
from rl_lightning.compat import build_td, td_entries
from rl_lightning.data.frames import FrameReplay, frame_keys
from rl_lightning.data.nstep import NStepReturns
from rl_lightning.data.progress import EpisodeLog
from rl_lightning.data.replay import TRAJ_KEY
from rl_lightning.data.rollout import RolloutBuffer
from rl_lightning.data.transfer import DeviceCopies
from rl_lightning.envs.agents import MASK_KEY, agent_transitions

__all__ = ["Ingestion", "rows"]


def stored_keys(needs: ReplayRequirements, nstep: bool) -> tuple | None:
    """The keys the replay stores (``None``: all): ``needs.sample_keys``, ``needs.extra_keys`` and n-step's
    ``steps_to_next_obs``."""
    if needs.sample_keys is None:
        return None
    return (*needs.sample_keys, *needs.extra_keys, *(("steps_to_next_obs",) if nstep else ()))


def missing_keys(batch: TensorDictBase, keys: Sequence[Any]) -> list[Any]:
    """Those of ``keys`` (nested keys allowed) that ``batch`` lacks."""
    present = set(batch.keys(True))
    return [k for k in keys if k not in present]


def rows(batch: TensorDictBase, keys: Sequence[Any] | None) -> TensorDictBase:
    """``batch.select(*keys, strict=False).reshape(-1)`` (``keys=None``: every key): the entries of a
    collected ``[num_envs, T]`` batch that the replay stores, one row per frame.

    For a plain ``TensorDict`` of tensors (the local collector's batches) the result is built leaf by leaf
    from views of the leaves, where TensorDict's ``select`` and ``reshape`` check and dispatch per entry:
    14 instead of 37 us for a one-frame SAC batch on a CPU, and with ``keys=None`` (every key, TD-MPC2's
    slices) 41 instead of 70 us for a one-frame hockey batch. Anything else (lazy stacks, non-tensor
    entries) takes ``select`` and ``reshape``.
    """
    out = None
    if type(batch) is TensorDict:
        if keys is None:
            out = _whole_rows(batch, batch.numel(), batch.batch_dims)
        else:
            out = _plain_rows(batch, keys)
    if out is None:
        out = (batch if keys is None else batch.select(*keys, strict=False)).reshape(-1)
    return out


def _whole_rows(td: TensorDict, n: int, lead: int) -> TensorDict | None:
    """``td.reshape(-1)`` for the leading ``lead`` dims, in one walk of views of its leaves; ``None`` where
    an entry is not a tensor or a plain ``TensorDict``."""
    entries: dict[str, Any] = {}
    for name, value in td_entries(td).items():
        if type(value) is TensorDict:
            value = _whole_rows(value, n, lead)
            if value is None:
                return None
        elif type(value) is torch.Tensor:
            value = value.reshape(n, *value.shape[lead:])
        else:
            return None
        entries[name] = value
    batch_size = torch.Size([n, *td.batch_size[lead:]])  # a nested entry keeps its own dims
    return build_td(entries, batch_size, td.device)


def _plain_rows(batch: TensorDict, keys: Sequence[Any]) -> TensorDict | None:
    """:func:`rows` from views of ``batch``'s leaves; ``None`` where a key's path meets something other
    than a plain ``TensorDict`` or a tensor."""
    n, lead = batch.numel(), batch.batch_dims
    tree: dict[str, Any] = {}
    for key in keys:
        path = (key,) if isinstance(key, str) else key
        node: Any = batch
        for part in path:
            if type(node) is not TensorDict:  # a lazy stack or another container on the way
                return None
            node = td_entries(node).get(part)
            if node is None:
                break
        if node is None:
            continue  # absent, as select(strict=False) allows
        if type(node) is not torch.Tensor:
            return None
        branch = tree
        for part in path[:-1]:
            branch = branch.setdefault(part, {})
        branch[path[-1]] = node.reshape(n, *node.shape[lead:])
    return _tree_td(tree, torch.Size([n]), batch.device)


def _tree_td(tree: dict[str, Any], batch_size: torch.Size, device: torch.device | None) -> TensorDict:
    entries = {k: _tree_td(v, batch_size, device) if type(v) is dict else v for k, v in tree.items()}
    return build_td(entries, batch_size, device)


class Ingestion:
    """Puts collected batches into the replay and keeps the episode statistics of this rank.

    Args:
        requirements: the algorithm's replay requirements (the keys it samples, the extra keys ``act``
            writes).
        nstep: n-step returns folded into every batch, or ``None``.
        copies: the run's device copies (frames go to the replay's device through them).
        warmup_frames: frames before which ``act`` has not run, so the extra keys may be absent.
        store_frames: the replay stores frames once (a :class:`FrameReplay`): rows hold the observations'
            frame serials.
        agent_group: the env's agent group (several agents per env), or ``None``. Each agent's steps are
            transitions (:func:`~rl_lightning.envs.agents.agent_transitions`); only those of agents active
            when the step began go into the replay, selected with one boolean index of the batch's rows.
            Episode statistics stay the env's (a return is the sum over its agents).

    State (``state_dict``): the episode log's (:class:`~rl_lightning.data.progress.EpisodeLog`).
    """

    def __init__(
        self,
        requirements: ReplayRequirements,
        nstep: NStepReturns | None,
        copies: DeviceCopies,
        warmup_frames: int = 0,
        store_frames: bool = False,
        agent_group: str | None = None,
    ) -> None:
        self.requirements = requirements
        self.nstep = nstep
        self.copies = copies
        self.warmup_frames = warmup_frames
        self.store_frames = store_frames
        self.agent_group = agent_group
        keys = stored_keys(requirements, nstep is not None)
        self.keys = frame_keys(keys) if store_frames else keys
        self.episodes = EpisodeLog()
        self._keys_checked = False
        #: Added to the trajectory ids of the batches (worker collectors number theirs from 0; a resumed
        #: buffer holds ids already).
        self.traj_offset = 0

    def reset(self) -> None:
        """A new collector starts: n-step windows start afresh."""
        if self.nstep is not None:
            self.nstep.reset()

    def ingest(self, batch: TensorDictBase, replay: Any, frames: int) -> None:
        """Records the finished episodes of a collected ``[num_envs, T]`` batch and writes its rows into
        ``replay``; ``frames`` is the frame count before this batch (all ranks)."""
        done = batch.get(("next", "done")).squeeze(-1)
        if done.any():
            returns = batch.get(("next", "episode_reward"))[done].squeeze(-1).tolist()
            lengths = batch.get(("next", "step_count"))[done].squeeze(-1).tolist()
            self.episodes.add(returns, lengths)
        if self.agent_group is not None:
            batch = agent_transitions(batch, self.agent_group)
        if self.requirements.extra_keys and frames >= self.warmup_frames:
            missing = missing_keys(batch, self.requirements.extra_keys)
            if missing:
                raise KeyError(
                    f"the algorithm's act must write {missing} (declared in its replay requirements) "
                    "into the collected data."
                )
        if isinstance(replay, RolloutBuffer):  # on-policy: the whole [N, T] rollout, to the module's device
            replay.extend_rollout(self.copies.to_module(batch))
            return
        if self.traj_offset and TRAJ_KEY in batch.keys(True):
            batch = batch.copy()  # a new entry, not a write into the collector's own buffers
            batch.set(TRAJ_KEY, batch.get(TRAJ_KEY) + self.traj_offset)
        if isinstance(replay, FrameReplay):
            batch = replay.index(batch)
        keys = self.keys
        if self.agent_group is not None and keys is not None:
            keys = (*keys, MASK_KEY)
        if self.nstep is not None:
            batch = self.nstep(batch, keys)
        if self.keys is not None and not self._keys_checked:
            self._check_sample_keys(batch)
        # Extra keys are absent from random warm-up frames (no act wrote them): kept where present.
        out = rows(batch, keys)
        if self.agent_group is not None:
            out = out[out.get(MASK_KEY)]
            if self.keys is not None:
                out = out.exclude(MASK_KEY)
        replay.extend(self.copies.to_replay(out))

    def _check_sample_keys(self, batch: TensorDictBase) -> None:
        keys = self.requirements.sample_keys or ()
        missing = missing_keys(batch, frame_keys(keys) if self.store_frames else keys)
        if missing:
            raise KeyError(
                f"the algorithm's replay_requirements().sample_keys name {missing}, which the collected data "
                "lacks; declare only keys the env or act writes (sample_keys=None stores everything)."
            )
        self._keys_checked = True

    def state_dict(self) -> dict[str, Any]:
        return self.episodes.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episodes.load_state_dict(state)
