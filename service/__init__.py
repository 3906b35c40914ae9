"""The REST service: submit sweeps to a Ray cluster as Ray Jobs, read them back from Ray and MLflow.

``service.app.create_app`` builds the FastAPI app; ``critbatch serve`` runs it (docs/service.md).
Routes in ``service.routes``, their dependencies in ``service.deps``, error answers in
``service.errors``. It depends on ``sweeps.spec`` (plain data, ``sweeps.spec.identity`` included),
``sweeps.remote`` (Ray Jobs and, through it, the MLflow reader) and ``sweeps.errors`` only: never torch,
transformers or Ray Tune; of ``workloads`` only the torch-free ``workloads.api`` the spec embeds its
sections from (through ``sweeps.spec``).
"""
