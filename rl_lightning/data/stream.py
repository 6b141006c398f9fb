"""The experience stream: collect, extend the replay, then sample and update as many times as owed.

Read as the textbook off-policy loop::

    for batch in collector:                     # collect_until_owed
        replay.extend(batch)                    # ingestion
        for _ in range(updates owed):           # UpdateRound
            update(replay.sample())

The stream is the train iterable Lightning iterates: one item per Lightning batch, a round of updates
(:class:`CollectingRound`), which ``training_step`` iterates. The frame budget says when updates are owed,
when the run ends and when a callback's batch end is due (the marks registered with it); the control (the
data module) says when to stop.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from tensordict import TensorDictBase
from torchrl.data.replay_buffers.samplers import RandomSampler

from rl_lightning.algos.base import PRIORITY_KEY
from rl_lightning.data.budget import FrameBudget
from rl_lightning.data.collection import Collection
from rl_lightning.data.ingest import Ingestion
from rl_lightning.data.rollout import RolloutBuffer
from rl_lightning.data.slices import InterleavedSliceSampler, TrajectorySliceSampler
from rl_lightning.data.transfer import DeviceCopies

__all__ = [
    "MAX_UPDATES_PER_BATCH",
    "CollectingRound",
    "ExperienceStream",
    "StreamControl",
    "UpdateRound",
]

#: Updates per item of the experience stream (a Lightning batch); see :class:`UpdateRound`.
MAX_UPDATES_PER_BATCH = 64
#: Samplers whose draws do not depend on the updates: a round draws all its samples in one call.
ROUND_SAMPLERS = (RandomSampler, TrajectorySliceSampler, InterleavedSliceSampler)


class StreamControl(Protocol):
    """What the stream asks of whoever runs it (the data module, through Lightning)."""

    def stop_now(self, local: bool) -> bool:
        """Whether to stop: ``local`` or a stop request, collectively over the ranks."""

    def aborting(self) -> bool:
        """Whether the run is being aborted (a second SIGTERM): it stops without finishing its round."""

    def end_fit(self) -> None:
        """Ends the fit after the current Lightning batch."""


class UpdateRound:
    """The samples of ``n`` consecutive updates, on the module's device.

    ``training_step`` runs ``update`` on each sample and hands each output to :meth:`feedback`, which
    writes new priorities into the replay before the next sample is drawn. Grouping the updates of one
    collection into few Lightning batches pays the training loop's per-batch cost (hooks, fetcher,
    optimizer wrappers: about a millisecond on a CPU, as much as a small network's update) once per
    round instead of once per update; callbacks that act on frames lose nothing, since frames only change
    between collections. A stop request is honoured between rounds, and between updates whose samples are
    drawn one by one (see below); the updates left stay owed.

    With uniform sampling (TorchRL's ``RandomSampler``: indices drawn with replacement, independent of
    the updates) and with the slice samplers (slices drawn with replacement, a whole number of them per
    sample) the round's ``n`` samples are drawn in one call of ``n * batch_size`` rows and split: the same
    distribution as ``n`` calls, since the buffer does not change within a round, at a fraction of the
    cost (one index draw and one gather instead of ``n``: a quarter for uniform samples, a third for
    TD-MPC2's slices with 8 envs, ``benchmarks/results/replay_overlap_cpu.json``). A replay in host memory
    sends the round's rows to the module's device in one copy before the first update, so with non-blocking
    copies the later samples arrive while the earlier updates run. Prioritized samples are drawn one by one:
    each must see the priorities of the update before it. A stop request is honoured between updates whose
    samples are drawn one by one, and before a round drawn in one call (which then runs to its end), so that
    a run resumed from the checkpoint the stop writes draws what the uninterrupted run draws; an abort (a
    second SIGTERM, after which no checkpoint is written) stops it between any two updates.
    """

    def __init__(self, stream: ExperienceStream, n: int) -> None:
        self.stream = stream
        self.n = n

    def __len__(self) -> int:
        return self.n

    def drawn_at_once(self) -> bool:
        """Whether the round's samples are drawn in one call (see the class doc)."""
        return self.n > 1 and type(self.stream.replay.sampler) in ROUND_SAMPLERS

    def _samples(self) -> Iterator[TensorDictBase]:
        stream = self.stream
        replay, copies = stream.replay, stream.copies
        if self.drawn_at_once():
            with warnings.catch_warnings():  # the buffer's batch size is the one of a single update
                warnings.filterwarnings("ignore", message="Got conflicting batch_sizes")
                rows = replay.sample(stream.batch_size * self.n)
            yield from copies.to_module(rows).split(stream.batch_size)
        else:
            while True:
                yield copies.to_module(replay.sample())

    def __iter__(self) -> Iterator[TensorDictBase]:
        stream = self.stream
        samples = self._samples()
        # Samples drawn at once are all used: a stop between them would leave the rest of the draw (and the
        # random numbers it took) behind, and a resumed run would draw those updates' samples anew.
        at_once = self.drawn_at_once()
        for i in range(self.n):
            if stream.control.stop_now(False) if i == 0 or not at_once else stream.control.aborting():
                stream.stop()
                return
            if stream.budget.owed <= 0:  # forfeited (an on-policy rollout's passes stopped early)
                return
            stream.budget.take_update()
            yield next(samples)

    def feedback(self, output: TensorDictBase) -> None:
        """Applies what an update returned: new priorities (prioritized replay); an on-policy rollout's
        early stop (its remaining updates forfeited)."""
        replay = self.stream.replay
        if isinstance(replay, RolloutBuffer) and replay.observe(output):
            self.stream.budget.forfeit()
        priority = output.get(PRIORITY_KEY, None)
        if priority is not None:
            copies = self.stream.copies
            index, value = copies.to_sampler(priority.get("index")), copies.to_sampler(priority.get("value"))
            self.stream.replay.update_priority(index, value)


class CollectingRound(UpdateRound):
    """An item of the experience stream: the collections the next updates wait for, then their round; and
    again, while no callback is due, up to ``MAX_UPDATES_PER_BATCH`` updates in all.

    Inert until ``training_step`` iterates it. Lightning's fetcher takes the next item of a stream before
    the current one has been trained (it prefetches a batch to know whether the epoch ends), so an item
    made with a size would be made from updates the current item is about to do: an extra round of them,
    and an item pending in the fetcher when a checkpoint is taken, lost on resume. This item decides what
    it does when it runs: it collects until updates are owed (nothing when earlier collections still owe
    some), then does up to ``MAX_UPDATES_PER_BATCH`` of them; when the frame budget is spent or a stop is
    requested it ends the fit and does none.

    When a round leaves updates to spare and no mark registered with the budget is due, the item collects
    again and does that collection's round too: SAC's one frame and one update, 64 times per Lightning batch
    instead of once. The data, the random draws and every callback's work happen in the same order and at
    the same frames as with one round per item; only the per-batch cost of Lightning's loop (about 0.7 ms on
    a CPU) is paid less often.
    """

    def __init__(self, stream: ExperienceStream) -> None:
        super().__init__(stream, 0)
        self.done = 0

    def __len__(self) -> int:
        return self.done

    def __iter__(self) -> Iterator[TensorDictBase]:
        stream, budget = self.stream, self.stream.budget
        while stream.collect_until_owed():
            self.n = min(budget.owed, MAX_UPDATES_PER_BATCH - self.done)
            for sample in super().__iter__():
                self.done += 1
                yield sample
            if budget.owed or self.done >= MAX_UPDATES_PER_BATCH or stream.stopped:
                return  # a full item, or a stop: the rest of the round is the next item's
            if budget.batch_end_due():
                return  # a callback is due at this batch end, or the budget is spent


class ExperienceStream:
    """The train iterable: items that collect, then do a round of updates (:class:`CollectingRound`).

    Args:
        budget: the frame budget (frames, updates owed).
        ingestion: puts collected batches into the replay.
        replay: the replay buffer.
        copies: the run's device copies (samples to the module, priorities back).
        batch_size: rows per update's sample.
        start: starts a collection (a fresh collector) for this iteration of the stream.
        stop_collection: shuts the collection down (also on an exception).
        control: stop decisions (the data module).
        sync_weights: refresh the worker processes' policy weights before each collection.
        set_frames: told the frame count after each collection (the module's ``set_frames``: exploration
            schedules), or ``None``.
    """

    def __init__(
        self,
        budget: FrameBudget,
        ingestion: Ingestion,
        replay: Any,
        copies: DeviceCopies,
        batch_size: int,
        start: Callable[[], Collection],
        stop_collection: Callable[[], None],
        control: StreamControl,
        sync_weights: bool = False,
        set_frames: Callable[[int], None] | None = None,
    ) -> None:
        self.budget, self.ingestion, self.replay, self.copies = budget, ingestion, replay, copies
        self.batch_size = batch_size
        self.start, self.stop_collection, self.control = start, stop_collection, control
        self.sync_weights = sync_weights
        self.set_frames = set_frames
        self.stopped = False
        self._collection: Collection | None = None
        self._batches: Iterator[TensorDictBase] | None = None

    def __iter__(self) -> Iterator[UpdateRound]:
        self.stopped = False
        self._collection = self.start()
        self._batches = iter(self._collection.collector)
        try:
            while not self.stopped:
                yield CollectingRound(self)
        finally:
            self._batches = self._collection = None
            self.stop_collection()

    def stop(self) -> None:
        """Ends the stream and the fit after the current item."""
        self.stopped = True
        self.control.end_fit()

    def collect_until_owed(self) -> bool:
        """Collects until updates are owed (those granted but not yet done, also those owed when a
        checkpoint was taken, need no collection); ``False`` when the fit is to stop instead.

        The budget is in frames: it ends this epoch and the fit (max_epochs is unbounded so that a finished
        run resumed with a larger total_frames continues). A stop request (Ctrl-C, a callback) is checked
        between collections, since the warm-up grants no updates, and between updates (``UpdateRound``).
        """
        budget = self.budget
        while budget.owed <= 0:
            if self.control.stop_now(budget.spent):
                self.stop()
                return False
            if self.sync_weights:
                self._collection.collector.update_policy_weights_()
            batch = next(self._batches)
            if batch.batch_dims > 2:  # [workers, envs, T] -> [workers * envs, T]
                batch = batch.reshape(-1, batch.shape[-1])
            n_envs = batch.shape[0] if batch.batch_dims > 1 else 1
            keep = budget.steps_to_keep(batch.shape[-1], n_envs)
            if keep < batch.shape[-1]:
                batch = batch[..., :keep]
            self.ingestion.ingest(batch, self.replay, budget.frames)
            budget.add(batch.numel())
            if self.set_frames is not None:
                self.set_frames(budget.frames)
        return True
