"""The ``critbatch`` command line: local sweeps (:mod:`sweeps.cli.main`), cluster submission and the
service (:mod:`sweeps.cli.cluster`), Kubernetes rendering (:mod:`sweeps.cli.k8s`) and branching
(:mod:`sweeps.cli.branch`). The console script is ``critbatch = "sweeps.cli:app"``; ``python -m
sweeps.cli`` is the same program (Ray job entrypoints use it).
"""

from sweeps.cli.main import app

__all__ = ["app"]
