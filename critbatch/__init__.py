"""The ``critbatch`` command line, the composition root: it sits above ``sweeps``, ``workloads`` and
``service``, may import any of them, and none of them imports it (``tests/test_layering.py``).

Local sweeps (:mod:`critbatch.main`), cluster submission and the service (:mod:`critbatch.cluster`),
Kubernetes rendering (:mod:`critbatch.k8s`), branching (:mod:`critbatch.branch`), data preparation
(:mod:`critbatch.data`) and cluster planning (:mod:`critbatch.plan`), each attached to the app by name in
``critbatch.main._register_commands``. The console script is ``critbatch = "critbatch.main:main"``;
``python -m critbatch`` is the same program (Ray job entrypoints use it).
"""

from critbatch.main import app

__all__ = ["app"]
