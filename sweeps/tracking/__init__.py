"""Tracking of a sweep: the events it records (:mod:`sweeps.tracking.base`: ``Tracker``, ``CompositeTracker``),
the sinks by name (:mod:`sweeps.tracking.registry`), the MLflow names (:mod:`sweeps.tracking.schema`), the
driver's MLflow writes (:mod:`sweeps.tracking.writer`: ``MlflowTracker``, ``Outbox``, the Tune callback) and
the reads of the Ray Jobs client and the service (:mod:`sweeps.tracking.reader`).

Import the modules themselves: this package imports none of them, so that reading a sweep back
(``schema``, ``reader``) never pulls in Ray Tune, which the writer needs.
"""

__all__: list[str] = []
