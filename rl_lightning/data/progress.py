"""The progress view: what the data path publishes to everyone outside it, read-only.

Callbacks (evaluation, checkpoints, logging, the progress bar, a curriculum) need the frame and update
counts, the run's totals, whether the warm-up is in and the episodes that finished. They read them here,
from ``trainer.datamodule.progress``, and nowhere else of the data module. The counts belong to the frame
budget and the episodes to the data path's :class:`EpisodeLog`; the view holds references to both and
copies nothing, so it is always current and costs no sync.

Three things a reader may do besides reading, none of which changes what another reader sees:

- take an :meth:`Progress.episode_reader`, its own cursor over the finished episodes (a read never drains
  the log for another reader);
- register a :class:`~rl_lightning.data.budget.Mark` (:meth:`Progress.register_mark`), a frame or update
  count it acts at; the budget then ends a Lightning batch when one comes due;
- reach the run's device copies (:attr:`Progress.copies`, the one switch every host/device copy of the data
  path goes through): ``NonBlockingTransfer`` turns their non-blocking mode on and off, evaluation sends
  its observations and actions through them. How data crosses devices, never what it holds.

Plain Python, tested without a Trainer.
"""

from __future__ import annotations

import weakref
from collections import deque
from typing import Any

from rl_lightning.data.budget import FrameBudget, Mark
from rl_lightning.data.transfer import DeviceCopies

__all__ = ["EpisodeLog", "EpisodeReader", "Progress"]

#: Returns kept for the progress bar's mean of recent episodes.
RECENT_EPISODES = 20


class EpisodeLog:
    """The finished episodes of this rank, ``(return, length)``, append-only, read through cursors.

    Each reader reads from its own cursor (:class:`EpisodeReader`); at each read the log forgets the
    episodes every live reader has read (none while it has no reader: a reader that comes later still gets
    them). ``count`` is every episode ever finished
    in the run, ``recent`` the returns of the last 20.

    State (``state_dict``, the keys checkpoints have always used): the count, the recent returns and the
    episodes some reader has not read yet (``pending_episodes``); a loaded log rewinds its readers to them,
    so a resumed run logs them with its next interval.
    """

    def __init__(self) -> None:
        self.count = 0
        self.recent: deque[float] = deque(maxlen=RECENT_EPISODES)
        self._items: list[tuple[float, int]] = []
        self._start = 0  # the index (in the run's episodes) of self._items[0]
        self._readers: weakref.WeakSet[EpisodeReader] = weakref.WeakSet()

    def add(self, returns: list[float], lengths: list[int]) -> None:
        """Records episodes that just finished."""
        self.recent.extend(returns)
        self._items.extend(zip(returns, lengths))
        self.count += len(returns)

    def reader(self) -> EpisodeReader:
        """A new cursor, at the oldest episode the log still holds."""
        reader = EpisodeReader(self, self._start)
        self._readers.add(reader)
        return reader

    def state_dict(self) -> dict[str, Any]:
        # The episodes not yet logged travel with the count: a run resumed from here logs their returns
        # with the next interval, so that every episode the count holds has its return in the metrics.
        return {"episodes": self.count, "recent_returns": list(self.recent),
                "pending_episodes": [list(e) for e in self._items]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["episodes"])
        self.recent.clear()
        self.recent.extend(state["recent_returns"])
        # Checkpoints written before the pending episodes were saved have none.
        self._items = [(float(r), int(n)) for r, n in state.get("pending_episodes", [])]
        self._start = self.count - len(self._items)
        for reader in self._readers:
            reader.cursor = self._start


class EpisodeReader:
    """One reader's cursor over an :class:`EpisodeLog`: :meth:`read` returns the episodes finished since its
    last read (oldest first) and leaves them to the other readers."""

    def __init__(self, log: EpisodeLog, cursor: int) -> None:
        self._log = log
        self.cursor = cursor

    def read(self) -> list[tuple[float, int]]:
        """The episodes ``(return, length)`` finished since the last read; the log then forgets those every
        live reader has read."""
        log = self._log
        out = log._items[max(0, self.cursor - log._start) :]
        self.cursor = log.count
        keep_from = min(r.cursor for r in log._readers)  # this reader is one of them
        if keep_from > log._start:
            del log._items[: keep_from - log._start]
            log._start = keep_from
        return out


class Progress:
    """The read-only view of a run's progress, over the budget and the episode log that own the figures.

    Attributes are properties without setters: ``progress.frames = 0`` raises ``AttributeError``.

    Args:
        budget: the frame budget (frames, updates, totals).
        episodes: the finished episodes of this rank.
        copies: the run's device copies.
    """

    __slots__ = ("_budget", "_copies", "_episodes")

    def __init__(self, budget: FrameBudget, episodes: EpisodeLog, copies: DeviceCopies) -> None:
        object.__setattr__(self, "_budget", budget)
        object.__setattr__(self, "_episodes", episodes)
        object.__setattr__(self, "_copies", copies)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the progress view is read-only; {name} belongs to the data path")

    @property
    def frames(self) -> int:
        """Env frames collected so far, all ranks."""
        return self._budget.frames

    @property
    def updates(self) -> int:
        """Updates done (begun) so far."""
        return self._budget.updates

    @property
    def total_frames(self) -> int:
        """The run's budget in env frames, all ranks."""
        return self._budget.total_frames

    @property
    def warmup_frames(self) -> int:
        """Frames collected before the first update, all ranks."""
        return self._budget.warmup_frames

    @property
    def in_warmup(self) -> bool:
        """The warm-up frames are not all in yet."""
        return self._budget.frames < self._budget.warmup_frames

    @property
    def spent(self) -> bool:
        """The budget's frames are all collected."""
        return self._budget.spent

    @property
    def episodes(self) -> int:
        """Episodes finished on this rank so far (the whole run's, across resumes)."""
        return self._episodes.count

    @property
    def recent_returns(self) -> tuple[float, ...]:
        """The returns of the last 20 episodes of this rank, oldest first."""
        return tuple(self._episodes.recent)

    @property
    def copies(self) -> DeviceCopies:
        """The run's device copies: the switch of every host/device copy of the data path."""
        return self._copies

    def use_non_blocking_copies(self, enabled: bool, pin_memory: bool = True) -> None:
        """Makes the run's copies toward the GPU ``non_blocking=True``, from pinned memory with
        ``pin_memory`` (``NonBlockingTransfer`` calls it; see :class:`.transfer.DeviceCopies`)."""
        self._copies.use_non_blocking(enabled, pin_memory)

    def episode_reader(self) -> EpisodeReader:
        """A cursor of one's own over the finished episodes (see :class:`EpisodeLog`)."""
        return self._episodes.reader()

    def register_mark(self, mark: Mark) -> None:
        """Has the budget end a Lightning batch when ``mark`` comes due (see :class:`FrameBudget`)."""
        self._budget.register_mark(mark)

    def due(self, mark: Mark) -> bool:
        """Whether ``mark`` is due now: the budget's count in its unit reached ``mark.next``
        (:meth:`FrameBudget.due`, written out: it runs at every batch end of every callback)."""
        budget = self._budget
        return (budget.frames if mark.unit == "frames" else budget.updates) >= mark.last + mark.every
