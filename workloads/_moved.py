"""The module paths ``workloads`` had before its subpackages, still importable.

Where it stands: installed by ``workloads/__init__.py`` (so by any import of ``workloads``); imports
nothing of ``workloads`` until an old path is imported, then exactly the module it moved to.

Why: Tune's saved state (``OUT/tune/<sweep id>/tuner.pkl``) pickles the trial trainable's closure,
which names functions by their module path (``workloads._ray_adapter.train_fn_per_worker``,
``workloads._ray_compat.drain_report_queue``, ``workloads.determinism.torch_threads_per_worker`` in
the main job's state); a sweep started before the move resumes only if those paths still load
(``sweeps/run/execute.py::check_tune_state_readable`` refuses the resume otherwise). Every moved
module is listed, not only those three: any other old path that a pickle might name loads as well.
``import workloads.determinism`` (an old path) gives the module object of ``workloads.train.determinism``
itself, so classes and functions are the same objects under either name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__all__ = ["MOVED", "install", "old_name"]

#: old module path -> where it lives now
MOVED = {
    **{f"workloads.{m}": f"workloads.train.{m}" for m in (
        "loop", "step", "sync", "evaluation", "schedule", "ema", "noise_scale", "batching", "scaling", "optim",
        "parallel", "determinism")},
    "workloads.shards": "workloads.data.shards",
    "workloads.prepare": "workloads.data.prepare",
    "workloads._prepare_io": "workloads.data._prepare_io",
    "workloads.tokenizer": "workloads.data.tokenizer",
    "workloads.flops": "workloads.model.flops",
    "workloads._ray_adapter": "workloads.ray.adapter",
    "workloads._ray_runner": "workloads.ray.runner",
    "workloads._ray_compat": "workloads.ray.compat",
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module it moved to.

    Not here: ``workloads.data`` and ``workloads.model``, packages now; the names of the old modules
    load from them through their ``__getattr__`` (:func:`old_name`).
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return None  # a placeholder module; exec_module puts the moved one in its place

    def exec_module(self, module) -> None:
        # the import system returns whatever sys.modules holds under the name once this returns
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def install() -> None:
    """Put the old-path finder first on ``sys.meta_path`` (idempotent). First, not last: an editable
    install of an older checkout (its finder sits after the path finder) would answer an old path with
    that checkout's file."""
    if not any(isinstance(f, _OldPaths) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldPaths())


def old_name(module: str, names: tuple[str, ...], name: str):
    """``name`` of ``module`` when it is one of ``names`` (what the flat module that a package replaced
    defined): the body of that package's module ``__getattr__``, which loads ``module`` on first use.

    Raises:
        AttributeError: any other name.
    """
    if name in names:
        return getattr(importlib.import_module(module), name)
    raise AttributeError(f"module {module.rpartition('.')[0]!r} has no attribute {name!r}")
