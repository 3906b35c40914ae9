"""MLflow tracking of a sweep: the names (:mod:`sweeps.tracking.schema`), the driver's writes
(:mod:`sweeps.tracking.writer`: ``Tracker``, ``Outbox``, the Tune callbacks) and the reads of the
Ray Jobs client and the service (:mod:`sweeps.tracking.reader`).

Import the modules themselves: this package imports none of them, so that reading a sweep back
(``schema``, ``reader``) never pulls in Ray Tune, which the writer needs.
"""

__all__: list[str] = []
