"""The Ray Train side of a trial: the one place ``workloads`` imports ``ray.train``.

``adapter`` is the worker function of a Tune trial's worker group (``train_fn_per_worker``),
``runner`` a trial runner's worker loop (``runner_fn_per_worker``), ``compat`` every private Ray
session API the workers use. Reached from ``sweeps`` only through ``workloads.api``; above the
workloads (it runs them through ``workloads.registry``), below nothing in ``workloads``.
Nothing is imported here: importing ``workloads.ray.compat`` does not load Ray Train.
"""
