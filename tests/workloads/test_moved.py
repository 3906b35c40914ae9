"""The module paths ``workloads`` had before its subpackages still load (``workloads/_moved.py``):
Tune's saved state of a sweep started on the old layout names them, and ``critbatch resume`` unpickles it."""

from __future__ import annotations

import importlib
import pickle

import pytest

from tests.conftest import ROOT
from workloads._moved import MOVED


def _old_pickle(module: str, name: str) -> bytes:
    """A pickle (protocol 0 GLOBAL) of ``module.name`` by reference, as an old ``tuner.pkl`` holds it."""
    return f"c{module}\n{name}\n.".encode()


def test_the_three_names_the_main_jobs_tune_state_holds_load_as_the_moved_objects():
    # the globals of OUT/tune/<sweep id>/tuner.pkl of the main job run on the old layout
    from workloads.ray.adapter import train_fn_per_worker
    from workloads.ray.compat import drain_report_queue
    from workloads.train.determinism import torch_threads_per_worker

    assert pickle.loads(_old_pickle("workloads._ray_adapter", "train_fn_per_worker")) is train_fn_per_worker
    assert pickle.loads(_old_pickle("workloads._ray_compat", "drain_report_queue")) is drain_report_queue
    assert pickle.loads(_old_pickle("workloads.determinism", "torch_threads_per_worker")) is torch_threads_per_worker


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_module_path_imports_the_module_it_moved_to(old, new):
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()  # a file there would be a second copy
    assert importlib.import_module(old) is importlib.import_module(new)


@pytest.mark.parametrize("package, module, name", [
    ("workloads.data", "workloads.data.corpus", "window_batch"),
    ("workloads.data", "workloads.data.corpus", "tokenizer_vocab_size"),
    ("workloads.model", "workloads.model.hf", "build_model"),
    ("workloads.model", "workloads.model.hf", "check_model_config"),
])
def test_the_names_of_a_flat_module_a_package_replaced_load_from_the_package(package, module, name):
    assert pickle.loads(_old_pickle(package, name)) is getattr(importlib.import_module(module), name)
    with pytest.raises(AttributeError):
        getattr(importlib.import_module(package), "no_such_name")
