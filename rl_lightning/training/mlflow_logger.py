"""Lightning's MLflow logger, writing metrics to the store in batches instead of at every logging call."""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from rl_lightning.compat import mlflow_logger_client, mlflow_logger_unstarted, set_mlflow_experiment_id
from rl_lightning.training.mlflow_store import prepare_sqlite_store

__all__ = ["BufferedMLFlowLogger", "live_history"]

#: The most metrics MLflow takes in one ``log_batch`` call.
MAX_METRICS_PER_BATCH = 1000


class BufferedMLFlowLogger(MLFlowLogger):
    """``MLFlowLogger`` whose metrics are written every ``flush_every_s`` seconds, in one ``log_batch``.

    Each ``log_batch`` is a database transaction: on the default SQLite store it costs about 6 ms of the
    training process on a CPU, whatever the number of metrics in it. A run logs its training metrics, its
    throughput and its episode statistics on their own cadences, hundreds of calls in a one-minute
    CartPole run (about 4% of its wall time). Here the metrics are kept in memory and written together
    once ``flush_every_s`` seconds have passed since the last write (and when ``MAX_METRICS_PER_BATCH``
    are waiting), so the MLflow UI lags by at most that long. ``finalize`` (the end of a fit, also an
    interrupted or failed one) writes what is left; ``flush_every_s=0`` writes at every call, as
    Lightning's logger does.

    A ``sqlite:///`` store that does not exist yet starts as a copy of an empty one
    (:func:`~rl_lightning.training.mlflow_store.prepare_sqlite_store`) rather than through MLflow's
    schema migrations.

    Args:
        flush_every_s: seconds between writes (>= 0).
        *args, **kwargs: ``MLFlowLogger``'s.

    Example:
        >>> logger = BufferedMLFlowLogger(tracking_uri="sqlite:///mlflow.db", flush_every_s=5.0)
    """

    def __init__(self, *args: Any, flush_every_s: float = 5.0, **kwargs: Any) -> None:
        if isinstance(flush_every_s, bool) or not isinstance(flush_every_s, int | float) or flush_every_s < 0:
            raise ValueError(
                f"logger.flush_every_s={flush_every_s!r} must be a number of seconds >= 0 "
                "(0 writes metrics at every logging call)."
            )
        bound = inspect.signature(MLFlowLogger.__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        prepare_sqlite_store(bound.arguments["tracking_uri"] or "")  # before MLFlowLogger opens the store
        super().__init__(*args, **kwargs)
        # The constructor's arguments, kept here rather than read back from MLFlowLogger's private copies.
        self._tracking_uri_given = bound.arguments["tracking_uri"]
        self._experiment_name_given = bound.arguments["experiment_name"]
        self._artifact_location_given = bound.arguments["artifact_location"]
        self._metric_prefix = bound.arguments["prefix"]
        synchronous = bound.arguments.get("synchronous")
        self._batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self.flush_every_s = float(flush_every_s)
        self._pending: list[Any] = []
        self._last_flush = time.monotonic()

    @property
    @override
    def experiment(self) -> Any:
        """MLflow's client, once the run exists (Lightning's, with the experiment found or made first).

        Lightning makes a missing experiment after looking it up; runs started at the same moment in a new
        store both find none, and the later ``create_experiment`` fails. Here the one that loses that race
        takes the experiment the other made.
        """
        if rank_zero_only.rank == 0 and mlflow_logger_unstarted(self):  # other ranks: Lightning's dummy
            set_mlflow_experiment_id(self, self._find_or_make_experiment())
        return super().experiment

    def _find_or_make_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        client = mlflow_logger_client(self, self._tracking_uri_given)
        name = self._experiment_name_given

        def live() -> str | None:
            found = client.get_experiment_by_name(name)
            return found.experiment_id if found is not None and found.lifecycle_stage != "deleted" else None

        if (experiment_id := live()) is not None:
            return experiment_id
        try:
            return client.create_experiment(name=name, artifact_location=self._artifact_location_given)
        except MlflowException:
            if (experiment_id := live()) is None:
                raise
            return experiment_id

    @override
    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        if self._metric_prefix:  # as Lightning's logger prefixes them
            metrics = {f"{self._metric_prefix}{self.LOGGER_JOIN_CHAR}{k}": v for k, v in metrics.items()}
        for key, value in metrics.items():
            if isinstance(value, str):
                continue  # MLflow metrics are numbers; Lightning's logger discards strings too
            key = re.sub("[^a-zA-Z0-9_/. -]+", "", key)  # the characters MLflow allows, as Lightning's
            self._pending.append(Metric(key=key, value=float(value), timestamp=timestamp_ms, step=step or 0))
        due = time.monotonic() - self._last_flush >= self.flush_every_s
        if due or len(self._pending) >= MAX_METRICS_PER_BATCH:
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        """Writes the metrics kept so far."""
        while self._pending:
            chunk = self._pending[:MAX_METRICS_PER_BATCH]
            self.experiment.log_batch(run_id=self.run_id, metrics=chunk, **self._batch_kwargs)
            del self._pending[: len(chunk)]
        self._last_flush = time.monotonic()

    @override
    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        if self._pending:
            self.flush()  # starts the MLflow run if nothing else has yet
        super().finalize(status)


def live_history(metrics: Any) -> list[Any]:
    """One metric's MLflow history as the run stands: the records (``step``, ``value``, ``timestamp``)
    sorted by step.

    A run resumed from a checkpoint goes on from the checkpoint's frames, and logs again at the frames it
    had logged between that checkpoint and its interruption; MLflow keeps both. Taken in the order they
    were written, a record at a smaller step than the one before starts over from there: the earlier
    records from that step on were logged by the part of the run that was lost, and are left out. (Equal
    steps are kept: a run may log twice at the same frame count, several updates after one collection.)

    Args:
        metrics: the ``mlflow.entities.Metric`` records of one key (``client.get_metric_history``).
    """
    kept: list[Any] = []
    for m in sorted(metrics, key=lambda m: (m.timestamp, m.step)):
        if kept and m.step < kept[-1].step:
            kept = [k for k in kept if k.step < m.step]
        kept.append(m)
    return sorted(kept, key=lambda m: m.step)
