"""Image observations in the replay: every frame stored once, frame stacks rebuilt at sampling.

A transition of an image game holds two stacks of ``k`` frames (the observation and the next one), which
share ``k - 1`` frames with each other and with the transitions before and after: stored as collected, one
Atari transition costs eight 84x84 frames (56 GB for a million). Here each frame the envs produce is
written once into a :class:`FrameStore` (a ring of uint8 frames on the replay's device, addressed by the
frame's serial number), and a transition row holds the serials of its two stacks instead of the pixels:
``obs_frames [k]`` and ``("next", "obs_frames") [k]``, 128 bytes for ``k = 4``. A sample gathers its
stacks from the store on the replay's device, so a GPU replay rebuilds them on the GPU and a host replay
sends uint8 stacks to the module, which scales them (:mod:`rl_lightning.nn.encoders`).

Which frames: an observation of shape ``[k * c, H, W]`` is ``k`` frames of ``c`` channels, the newest
last (gymnasium's ``FrameStackObservation``; ``k = 1`` for MinAtar, whose whole grid is the frame). At an
episode's first step the env's stack repeats its first frame, and so does the rebuilt one: the serials of
each env's current stack are followed on the host as the collected steps go by (:meth:`FrameReplay.index`).
Per env step one frame is written (the newest of the next observation), plus one at each episode start
(its first observation): a frame and a little per transition.

The store keeps ``frame_capacity`` frames, by default 10% more than the replay's transitions, so that an
episode start every 10 steps on average still leaves every live transition's frames in the store. Shorter
episodes make the oldest transitions' first frames fall out of the ring first; such stale rows are never
returned: a sample that may hold one (which the host knows without looking at the device) is checked and
its stale rows drawn again.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from rl_lightning.data.transfer import DeviceCopies

__all__ = ["FRAME_KEYS", "FrameReplay", "FrameStore", "frame_keys", "stores_frames"]

#: Where a transition row keeps its stacks' frame serials, in place of the observations.
FRAME_KEYS = {"observation": "obs_frames", ("next", "observation"): ("next", "obs_frames")}
#: Redraws of stale rows before a sample gives up (only a store far too small for its episodes needs more).
_MAX_REDRAWS = 100


def frame_keys(keys: tuple | None) -> tuple | None:
    """``keys`` (what the replay stores) with the observations replaced by their frame serials."""
    if keys is None:
        return None
    return tuple(FRAME_KEYS.get(k, k) for k in keys)


def stores_frames(setting: bool | str, observation_spec: Any, slice_len: int | None) -> bool:
    """Whether the replay stores frames once (``replay.store_frames``: ``auto``, ``true`` or ``false``).

    ``auto`` does for uint8 observations of two or more dims (images, MinAtar's grids) sampled as single
    transitions.

    Raises:
        ValueError: ``true`` with sub-trajectory samples, or an unknown setting.
    """
    if setting not in ("auto", True, False):
        raise ValueError(f"replay.store_frames={setting!r}: use auto, true or false.")
    if setting == "auto":
        return slice_len is None and observation_spec.dtype == torch.uint8 and len(observation_spec.shape) > 2
    if setting and slice_len is not None:
        raise ValueError(
            "replay.store_frames=true stores transitions, but this algorithm samples sub-trajectories; "
            "set replay.store_frames=false."
        )
    return bool(setting)


class FrameStore:
    """A ring of ``capacity`` frames, each addressed by its serial number (the count of frames written
    before it); a serial is kept until ``capacity`` more frames have been written.

    Args:
        capacity: frames kept.
        frame_shape: one frame's shape (``[c, H, W]``).
        device: where the frames live (the replay's device).
        dtype: the frames' dtype (uint8 for images).
    """

    def __init__(
        self, capacity: int, frame_shape: tuple[int, ...], device: torch.device, dtype: torch.dtype
    ) -> None:
        if capacity < 1:
            raise ValueError(f"frame capacity {capacity} must be positive.")
        self.capacity = capacity
        # Allocated, not written: memory is taken as frames arrive (a 1M-frame Atari store is 7.8 GB).
        self.frames = torch.empty(capacity, *frame_shape, dtype=dtype, device=device)
        self.written = 0

    @property
    def oldest(self) -> int:
        """The smallest serial still in the store."""
        return max(0, self.written - self.capacity)

    def add(self, frames: torch.Tensor) -> None:
        """Writes ``frames`` ``[M, *frame_shape]`` as serials ``written .. written + M - 1``."""
        m = frames.shape[0]
        if m > self.capacity:
            raise ValueError(f"{m} frames at once exceed the frame store's capacity {self.capacity}.")
        start = self.written % self.capacity
        first = min(m, self.capacity - start)
        self.frames[start : start + first] = frames[:first]
        if first < m:  # wrapped around the ring
            self.frames[: m - first] = frames[first:]
        self.written += m

    def get(self, serials: torch.Tensor) -> torch.Tensor:
        """The frames of ``serials`` ``[...]`` (on the store's device): ``[..., *frame_shape]``."""
        return self.frames[serials % self.capacity]

    def state_dict(self) -> dict[str, Any]:
        """The written frames (on the store's device) and the count written."""
        kept = min(self.written, self.capacity)
        # A copy of the written part: a view would make torch.save write the whole allocated ring.
        return {"frames": self.frames[:kept].clone(), "written": self.written}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores :meth:`state_dict`'s frames (already on the store's device)."""
        frames = state["frames"]
        if frames.shape[1:] != self.frames.shape[1:] or frames.shape[0] > self.capacity:
            raise ValueError(
                f"the saved frames {tuple(frames.shape)} do not fit this run's frame store "
                f"{tuple(self.frames.shape)}; resume with the replay settings the run was saved with."
            )
        self.frames[: frames.shape[0]] = frames
        self.written = int(state["written"])


class FrameReplay:
    """A replay of image transitions whose observations are frame stacks rebuilt from a :class:`FrameStore`.

    It stands where the data path puts a ``TensorDictReplayBuffer`` (``extend``, ``sample``,
    ``update_priority``, ``sampler``, ``dumps``/``loads``, ``len``) and wraps one that stores the
    transition rows with frame serials (:data:`FRAME_KEYS`). Ingestion calls :meth:`index` on every
    collected batch before anything else reads its observations (n-step returns gather the next serials as
    they gather any ``"next"`` entry).

    Args:
        buffer: the transition buffer (its capacity counts transitions).
        obs_shape: one observation's shape ``[k * c, H, W]`` (``k`` stacked frames of ``c`` channels).
        stack: ``k``.
        copies: the run's device copies (frames go to the replay's device through them).
        frame_capacity: frames the store keeps (``None``: the buffer's capacity plus 10% and 64).
        dtype: the observations' dtype (uint8 for images).
    """

    def __init__(
        self,
        buffer: Any,
        obs_shape: tuple[int, ...],
        stack: int,
        copies: DeviceCopies,
        frame_capacity: int | None = None,
        dtype: torch.dtype = torch.uint8,
    ) -> None:
        if stack < 1 or obs_shape[0] % stack:
            raise ValueError(
                f"observations of shape {list(obs_shape)} are not {stack} stacked frames along their first "
                "axis."
            )
        self.buffer = buffer
        self.copies = copies
        self.obs_shape = tuple(obs_shape)
        self.stack = stack
        self.channels = obs_shape[0] // stack
        capacity = frame_capacity
        if capacity is None:
            capacity = math.ceil(1.1 * buffer.storage.max_size) + 64
        frame_shape = (self.channels, *obs_shape[1:])
        self.store = FrameStore(capacity, frame_shape, copies.replay_device, dtype)
        #: Serials of each env's current stack ``[num_envs, k]`` (``None``: every env starts an episode).
        self._stacks: torch.Tensor | None = None
        #: The smallest serial the stacks of the last two indexed batches referenced (n-step rows of the
        #: batch before the current one are written with it).
        self._lows: deque[int] = deque(maxlen=2)
        #: ``(rows written after an extend, smallest serial its rows may reference)``, oldest first.
        self._extents: deque[tuple[int, int]] = deque()
        self._rows = 0

    # ------------------------------------------------------------------ ingestion side
    def index(self, batch: TensorDictBase) -> TensorDictBase:
        """Writes the new frames of a collected ``[N, T]`` batch (host) into the store and returns the batch
        with the observations replaced by their stacks' serials ``[N, T, k]``.

        An episode starts where the root's ``step_count`` is 0: so does every env of a new collector, which
        is why the stacks need no reset of their own.
        """
        obs = batch.get("observation")
        nxt = batch.get(("next", "observation"))
        if tuple(obs.shape[2:]) != self.obs_shape:
            raise ValueError(
                f"observations {list(obs.shape[2:])} do not match the replay's {list(self.obs_shape)}."
            )
        n, steps = batch.shape[:2]
        k, c = self.stack, self.channels
        starts = batch.get("step_count").reshape(n, steps) == 0
        stacks = self._stacks
        if stacks is None or stacks.shape[0] != n:
            stacks = torch.zeros(n, k, dtype=torch.long)
            starts[:, 0] = True
        serial = self.store.written
        pieces, obs_serials, next_serials = [], [], []
        low = math.inf
        for t in range(steps):
            first = starts[:, t]
            if first.any():  # the first observation of an episode: its newest frame, repeated k times
                m = int(first.sum())
                pieces.append(obs[first, t, -c:])
                stacks = stacks.clone()
                stacks[first] = torch.arange(serial, serial + m).unsqueeze(1).expand(m, k)
                serial += m
            obs_serials.append(stacks)
            low = min(low, int(stacks[:, 0].min()))
            pieces.append(nxt[:, t, -c:])
            stacks = torch.cat([stacks[:, 1:], torch.arange(serial, serial + n).unsqueeze(1)], 1)
            serial += n
            next_serials.append(stacks)
        self._stacks = stacks
        self._lows.append(int(low))
        self.store.add(self.copies.to_replay(torch.cat(pieces)))
        out = batch.exclude("observation", ("next", "observation"))
        out.set("obs_frames", torch.stack(obs_serials, 1))
        out.set(("next", "obs_frames"), torch.stack(next_serials, 1))
        return out

    # ------------------------------------------------------------------ the buffer's interface
    def __len__(self) -> int:
        return len(self.buffer)

    @property
    def sampler(self) -> Any:
        return self.buffer.sampler

    @property
    def storage(self) -> Any:
        return self.buffer.storage

    def extend(self, rows: TensorDictBase) -> torch.Tensor:
        """Adds transition rows (with frame serials, see :meth:`index`)."""
        index = self.buffer.extend(rows)
        self._rows += rows.shape[0]
        self._extents.append((self._rows, min(self._lows, default=0)))
        capacity = self.buffer.storage.max_size
        while len(self._extents) > 1 and self._extents[0][0] <= self._rows - capacity:
            self._extents.popleft()  # every row of that extend has been overwritten
        return index

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor) -> None:
        self.buffer.update_priority(index, priority)

    def may_hold_stale_rows(self) -> bool:
        """Whether a live row may reference a frame the store has dropped (known on the host)."""
        return bool(self._extents) and self._extents[0][1] < self.store.oldest

    def sample(self, batch_size: int | None = None) -> TensorDictBase:
        """A sample of transitions with their observation stacks rebuilt ``[B, k * c, H, W]``."""
        rows = self.buffer.sample(batch_size)
        if self.may_hold_stale_rows():
            rows = self._redraw_stale(rows)
        obs = rows.get("obs_frames")
        nxt = rows.get(("next", "obs_frames"))
        out = rows.exclude("obs_frames", ("next", "obs_frames"))
        obs, nxt = self.copies.to_replay(obs, "frame_serials"), self.copies.to_replay(nxt, "frame_serials")
        out.set("observation", self.store.get(obs).reshape(*obs.shape[:-1], *self.obs_shape))
        out.set(("next", "observation"), self.store.get(nxt).reshape(*nxt.shape[:-1], *self.obs_shape))
        return out

    def _redraw_stale(self, rows: TensorDictBase) -> TensorDictBase:
        for _ in range(_MAX_REDRAWS):
            stale = rows.get("obs_frames").min(-1).values < self.store.oldest
            count = int(stale.sum())
            if count == 0:
                return rows
            rows[stale] = self.buffer.sample(count)
        raise RuntimeError(
            f"the frame store ({self.store.capacity} frames) is too small for the replay's episodes: most "
            "sampled transitions lost their first frames; raise replay.frame_capacity."
        )

    def dumps(self, path: str | Path) -> None:
        """Writes the transition buffer (TorchRL's format) and the frames (``frames.pt``, with the envs'
        current stacks) to ``path``."""
        path = Path(path)
        (path / "transitions").mkdir(parents=True, exist_ok=True)
        self.buffer.dumps(path / "transitions")
        store = self.store.state_dict()
        store["frames"] = self.copies.to_host(store["frames"], "checkpoint")
        # The stacks are serials on the host: the envs' current stacks, for a run whose envs continue.
        state = {
            **store, "extents": list(self._extents), "rows": self._rows, "stacks": self._stacks,
            "lows": list(self._lows),
        }  # fmt: skip
        torch.save(state, path / "frames.pt")

    def loads(self, path: str | Path) -> None:
        """Restores what :meth:`dumps` wrote."""
        path = Path(path)
        self.buffer.loads(path / "transitions")
        state = torch.load(path / "frames.pt", weights_only=True)
        self.store.load_state_dict({**state, "frames": self.copies.to_replay(state["frames"], "checkpoint")})
        self._extents = deque((int(a), int(b)) for a, b in state["extents"])
        self._rows = int(state["rows"])
        # The envs' current stacks: a resumed run whose envs continue their episodes goes on with them (an
        # env that starts afresh begins a new stack at its first step, whose step count is 0).
        self._stacks = state.get("stacks")
        self._lows = deque((int(low) for low in state.get("lows", ())), maxlen=2)
