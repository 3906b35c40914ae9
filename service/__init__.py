"""The REST service: submit sweeps to a Ray cluster as Ray Jobs, read them back from Ray and MLflow.

``service.app.create_app`` builds the FastAPI app; ``critbatch serve`` runs it (docs/service.md).
It depends on ``sweeps.spec`` (plain data), ``sweeps.remote.jobs`` (Ray Jobs and MLflow readers) and
``sweeps.errors`` only: never torch, transformers, Ray Tune or ``workloads``.
"""
