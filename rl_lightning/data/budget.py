"""The frame budget: the only owner of a run's frame and update counters.

A run's budget is environment frames (``total_frames``), and the update-to-data ratio turns collected frames
into updates owed. This class is plain Python, knows nothing of Lightning or TorchRL, and is what a
checkpoint stores of the schedule.

It is also the run's one schedule: whoever acts at a frame or update count (an evaluation, a checkpoint, a
log line) registers a :class:`Mark` with it, and the budget says when one is due, which is when the data
path ends a Lightning batch so that the callbacks run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FrameBudget", "Mark"]


@dataclass(eq=False)
class Mark:
    """A count a reader acts at: every ``every`` frames (or updates) after ``last``.

    The owner moves ``last`` when it has acted (an evaluation, a checkpoint) and may change ``every`` (a
    curriculum's stage length); the budget compares the count with :attr:`next`. ``every=0`` is due at
    every batch end, ``every=math.inf`` never.

    Args:
        unit: ``frames`` (env frames, all ranks) or ``updates``.
        every: the interval.
        last: the count the owner last acted at.
    """

    unit: Literal["frames", "updates"]
    every: float = math.inf
    last: int = 0

    def __post_init__(self) -> None:
        if self.unit not in ("frames", "updates"):
            raise ValueError(f"Mark unit={self.unit!r} must be 'frames' or 'updates'.")

    @property
    def next(self) -> float:
        """The count at which the mark is next due."""
        return self.last + self.every


@dataclass
class FrameBudget:
    """Frames collected, updates done and owed, and the update-to-data credit of one run.

    The ranks of a data-parallel run collect in lockstep, so ``frames`` counts the frames of all ranks (the
    local count times ``world_size``); ``total_frames`` and ``warmup_frames`` are global and
    ``updates_per_frame`` is per rank (an update averages ``world_size`` batches' gradients, so the samples
    drawn per frame collected are the single-process ones).

    Args:
        total_frames: the run's budget in env frames (all ranks).
        warmup_frames: frames collected before the first update (all ranks).
        updates_per_frame: updates granted per frame this rank collects, once the warm-up is in.
        warmup_burst: TD-MPC2's seeding burst: the first grant after the warm-up is one update per warm-up
            frame of this rank, whatever ``updates_per_frame``.
        updates_per_collection: an on-policy run's grant: this many updates for every collection (its
            rollout's epochs × minibatches), whatever its frames; ``None``: the ratio applies.
        world_size: ranks collecting in lockstep.
    """

    total_frames: int
    warmup_frames: int = 0
    updates_per_frame: float = 1.0
    warmup_burst: bool = False
    updates_per_collection: int | None = None
    world_size: int = 1
    frames: int = 0
    updates: int = 0
    owed: int = 0
    credit: float = 0.0
    burst_done: bool = False
    marks: list[Mark] = field(default_factory=list, repr=False)

    @property
    def spent(self) -> bool:
        """The budget's frames are all collected."""
        return self.frames >= self.total_frames

    def frames_left(self) -> int:
        """This rank's share of the frames still to collect."""
        return -(-(self.total_frames - self.frames) // self.world_size)

    def random_frames_left(self, frames_per_batch: int) -> int | None:
        """This rank's warm-up frames still to collect, rounded up to whole collections (a collector rounds
        them up itself, with a warning); ``None`` when the warm-up is in."""
        left = -(-max(0, self.warmup_frames - self.frames) // self.world_size)
        return -(-left // frames_per_batch) * frames_per_batch or None

    def steps_to_keep(self, steps: int, num_envs: int) -> int:
        """How many of a collection's ``steps`` time steps of ``num_envs`` envs fit in the budget: all, or
        as many as end the run at ``total_frames`` (at the next multiple of ``num_envs`` when it does not
        divide it)."""
        left = self.frames_left()
        if steps * num_envs <= left:
            return steps
        return -(-left // num_envs)

    def add(self, local_frames: int) -> int:
        """Counts a collection of ``local_frames`` frames of this rank; returns the updates it grants (none
        until the warm-up is in), which are then owed."""
        self.frames += local_frames * self.world_size
        if self.frames < self.warmup_frames:
            return 0
        granted = self.updates_due(local_frames)
        self.owed += granted
        return granted

    def updates_due(self, new_frames: int) -> int:
        """How many updates the update-to-data ratio grants for ``new_frames`` new frames of this rank.

        With ``warmup_burst`` the first grant after the warm-up is the seeding burst: one update per warm-up
        frame of this rank, as the reference trainer runs ``seed_steps`` updates when seeding ends; the ratio
        applies only to that collection's frames past the warm-up, and to every later collection.
        """
        if self.updates_per_collection is not None:
            return self.updates_per_collection
        ratio = self.updates_per_frame
        if self.warmup_burst and not self.burst_done:
            self.burst_done = True
            share = self.warmup_frames / self.world_size
            past = min(new_frames, max(0, self.frames - self.warmup_frames) / self.world_size)
            self.credit += share + past * ratio
        else:
            self.credit += new_frames * ratio
        n = int(self.credit)
        self.credit -= n
        return n

    def take_update(self) -> None:
        """One owed update is being done."""
        self.owed -= 1
        self.updates += 1

    # ------------------------------------------------------------------ the schedule
    def register_mark(self, mark: Mark) -> None:
        """Adds ``mark`` to the schedule (once: registering it again changes nothing)."""
        if not any(m is mark for m in self.marks):
            self.marks.append(mark)

    def due(self, mark: Mark) -> bool:
        """Whether ``mark``'s count is reached."""
        return (self.frames if mark.unit == "frames" else self.updates) >= mark.next

    def batch_end_due(self) -> bool:
        """Whether the run reached a batch end it must not run past: the frames are spent or a registered
        mark is due. Marks belong to the callbacks and move only at batch ends, so between two batch ends
        this only turns from False to True."""
        counts = {"frames": self.frames, "updates": self.updates}
        return self.spent or any(counts[m.unit] >= m.last + m.every for m in self.marks)

    def forfeit(self) -> None:
        """The updates still owed are dropped (an on-policy rollout's passes stopped early)."""
        self.owed = 0

    def state_dict(self) -> dict[str, Any]:
        """The counters, under the keys checkpoints have always used."""
        return {
            "frames": self.frames,
            "updates": self.updates,
            "owed_updates": self.owed,
            "update_credit": self.credit,
            "burst_done": self.burst_done,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.frames = int(state["frames"])
        self.updates = int(state["updates"])
        self.owed = int(state["owed_updates"])
        self.credit = float(state["update_credit"])
        self.burst_done = bool(state["burst_done"])
