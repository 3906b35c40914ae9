"""The tracking sinks by name, and :func:`build_tracker`, which makes the sweep's
:class:`~sweeps.tracking.base.Tracker` from the names chosen (``CRITBATCH_TRACKING_SINKS``, default ``mlflow``).

A sink is a :class:`~sweeps.tracking.base.Tracker` subclass and one entry in :data:`SINKS`: a function from
the :class:`SinkContext` to the tracker, importing its module lazily (the MLflow sink imports MLflow and Ray
Tune, which reading this registry must not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sweeps.errors import InvalidInput
from sweeps.spec import SweepSpec
from sweeps.tracking.base import CompositeTracker, Tracker

__all__ = ["DEFAULT_SINKS", "SINKS", "SinkContext", "build_tracker"]


@dataclass(frozen=True, kw_only=True)
class SinkContext:
    """What a sink is built from: the sweep and where it is recorded.

    Attributes:
        tracking_uri: the MLflow tracking URI of the sweep (``sweep.json``'s ``tracking_uri``).
        spec: the resolved sweep spec.
        sweep_id: the sweep id.
        fingerprint: the fingerprint of the spec the sweep id is bound to, or None.
        drain_s: how long the end of the sweep retries undelivered writes, in seconds.
    """

    tracking_uri: str
    spec: SweepSpec
    sweep_id: str
    fingerprint: str | None
    drain_s: float


def _mlflow(ctx: SinkContext) -> Tracker:
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.writer import MlflowTracker, configure_mlflow_env

    configure_mlflow_env()
    return MlflowTracker(
        MlflowClient(ctx.tracking_uri), ctx.spec, ctx.sweep_id, fingerprint=ctx.fingerprint, drain_s=ctx.drain_s
    )


#: sink name -> the function that builds it
SINKS: dict[str, Callable[[SinkContext], Tracker]] = {
    "mlflow": _mlflow,
}
#: the sinks a sweep records to when none are chosen
DEFAULT_SINKS: tuple[str, ...] = ("mlflow",)


def build_tracker(ctx: SinkContext, names: Sequence[str] = DEFAULT_SINKS) -> Tracker:
    """The sweep's tracker: the one sink named, or a :class:`~sweeps.tracking.base.CompositeTracker` of several
    (the first is the primary, whose ids ``sweep.json`` records). No run is started.

    Raises:
        InvalidInput: no name, or a name that is not in :data:`SINKS`.
    """
    unknown = [n for n in names if n not in SINKS]
    if unknown or not names:
        raise InvalidInput(
            f"CRITBATCH_TRACKING_SINKS: unknown tracking sink(s) {unknown or list(names)}; known: {sorted(SINKS)}"
        )
    trackers = [SINKS[n](ctx) for n in names]
    return trackers[0] if len(trackers) == 1 else CompositeTracker(trackers)
