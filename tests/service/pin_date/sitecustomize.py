"""Test harness, on ``PYTHONPATH`` only where a test puts it: with ``CRITBATCH_TEST_PIN_DATE`` set,
Ray Tune's ``date_str()`` returns that value in every Python process of the cluster.

Ray stages a Tune experiment on the driver node under ``<session>/artifacts/<date_str()>/<run
name>/``; pinning the date makes every sweep on the test cluster "start in the same second", so a
test of per-sweep isolation does not depend on luck.
"""

import importlib.abc
import importlib.util
import os
import sys

_PIN = os.environ.get("CRITBATCH_TEST_PIN_DATE")


class _PinDate(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "ray.tune.utils":
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_pinned(module):
            exec_module(module)
            module.date_str = lambda: _PIN

        spec.loader.exec_module = exec_pinned
        return spec


if _PIN:
    sys.meta_path.insert(0, _PinDate())
