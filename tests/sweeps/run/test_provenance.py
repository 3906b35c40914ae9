"""What a sweep's numbers were computed with (sweeps/run/provenance.py): versions and thread settings in
``cbs.json``'s ``provenance`` and as ``critbatch.provenance.*`` tags of the MLflow parent run (a real SQLite
store). The end-to-end check, on a real sweep's ``cbs.json`` and its workers' own reports, is
``tests/sweeps/run/test_sweep_integration.py::test_cbs_json_and_the_parent_run_say_what_the_numbers_were_computed_with``."""

from __future__ import annotations

import importlib.metadata
import json
import platform

import pytest
from mlflow.tracking import MlflowClient

from sweeps.run.provenance import PROVENANCE_PACKAGES, sweep_provenance
from sweeps.spec import parse_spec
from sweeps.tracking import schema
from sweeps.tracking.writer import MlflowTracker


def _spec(tiny_spec_dict: dict, **resources):
    d = dict(tiny_spec_dict)
    d["resources"] = {**d.get("resources", {}), **resources}
    return parse_spec(d)


@pytest.mark.parametrize("cpus, threads", [(1.0, 1), (0.5, 1), (2.5, 2), (4, 4)])
def test_cpu_workers_get_a_fixed_thread_count_and_deterministic_algorithms(tiny_spec_dict, cpus, threads):
    prov = sweep_provenance(_spec(tiny_spec_dict, cpus_per_worker=cpus))
    assert prov["worker"] == {
        "device": "cpu",
        "torch_num_threads": threads,
        "deterministic_algorithms": True,
        "deterministic_warn_only": True,
    }
    assert prov["python"] == platform.python_version()
    assert prov["packages"] == {n: importlib.metadata.version(n) for n in PROVENANCE_PACKAGES}
    assert set(prov["driver"]) == {"omp_num_threads", "torch_num_threads"}
    json.dumps(prov)  # plain JSON, as cbs.json holds it


def test_gpu_workers_keep_torch_defaults_and_say_so(tiny_spec_dict):
    prov = sweep_provenance(_spec(tiny_spec_dict, gpus_per_worker=1))
    assert prov["worker"]["device"] == "cuda" and prov["worker"]["deterministic_algorithms"] is False
    assert prov["worker"]["deterministic_warn_only"] is None


def test_the_parent_run_carries_the_provenance_of_cbs_json(tiny_spec_dict, mlflow_uri, tmp_path):
    spec = _spec(tiny_spec_dict)
    cbs = {
        "status": "no_targets",
        "b_crit": None,
        "b_crit_ci": None,
        "target_loss": None,
        "provenance": sweep_provenance(spec),
    }
    art = tmp_path / "art"
    art.mkdir()
    (art / schema.ARTIFACT_CBS).write_text(json.dumps(cbs))  # as finish_sweep hands it over
    tracker = MlflowTracker(MlflowClient(mlflow_uri), spec, "provenance-sweep")
    tracker.start_parent()
    assert tracker.finish("SUCCEEDED", {}, str(art), drain_s=5)
    tags = MlflowClient(mlflow_uri).get_run(tracker.parent_run_id).data.tags
    prov = cbs["provenance"]
    for name in PROVENANCE_PACKAGES:
        assert tags[f"critbatch.provenance.packages.{name}"] == prov["packages"][name]
    assert tags["critbatch.provenance.python"] == platform.python_version()
    assert tags["critbatch.provenance.platform"] == prov["platform"]
    assert tags["critbatch.provenance.worker.torch_num_threads"] == "1"
    assert tags["critbatch.provenance.worker.deterministic_algorithms"] == "True"
    assert tags["critbatch.provenance.worker.deterministic_warn_only"] == "True"
    assert tags["critbatch.provenance.driver.torch_num_threads"] == str(prov["driver"]["torch_num_threads"])
    assert tags["critbatch.provenance.driver.omp_num_threads"] == str(prov["driver"]["omp_num_threads"])
    assert {k for k in tags if k.startswith(schema.TAG_PROVENANCE_PREFIX)} == set(schema.provenance_tags(prov))
