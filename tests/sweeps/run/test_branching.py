import json

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from sweeps.run.branching import local_cbs_multiplier
from sweeps.cli.main import app
from tests.conftest import write_spec


def test_local_cbs_multiplier_by_hand():
    # Merrill et al. 2025: k* = max k with L_k <= L_j + eps for all j < k
    assert local_cbs_multiplier({0.5: 2.00, 1: 2.005, 2: 2.008, 4: 2.05, 8: 2.2}, 0.01) == 2
    # a larger k that recovers is accepted even after a failing one
    assert local_cbs_multiplier({1: 2.0, 2: 2.02, 4: 2.005}, 0.01) == 4
    assert local_cbs_multiplier({1: float("nan"), 2: float("nan")}, 0.01) is None
    assert local_cbs_multiplier({1: 2.0, 2: float("nan"), 4: 2.0}, 0.01) == 4


@pytest.mark.slow
def test_branching_on_a_tiny_model_produces_a_local_cbs_series(tmp_path, tiny_spec_dict, mlflow_uri):
    d = dict(tiny_spec_dict)
    d["branch"] = {"points_fraction": [0.0, 0.5, 1.0], "multipliers": [0.5, 1, 2], "window_tokens": 1024, "epsilon": 0.01}
    spec = write_spec(tmp_path, d)
    uri = mlflow_uri
    r = CliRunner().invoke(app, ["branch", str(spec), "--output", str(tmp_path / "out"), "--tracking-uri", uri])
    assert r.exit_code == 0, r.output
    res = json.loads((tmp_path / "out" / "branch.json").read_text())
    series = res["local_cbs"]
    assert [p["tokens_seen"] for p in series] == [0, 4096, 8192]
    for p in series:
        assert p["k_star"] in (0.5, 1, 2)
        assert p["local_cbs_sequences"] == p["k_star"] * 8
        assert all(v is not None for v in p["losses"].values())
    assert res["flops_measurement"] > 0
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("tiny").experiment_id])
    branches = [x for x in runs if x.data.tags.get("critbatch.role") == "branch"]
    assert len(branches) == 9
    parent = [x for x in runs if x.data.tags.get("critbatch.role") == "branch-sweep"][0]
    assert all(x.data.tags["mlflow.parentRunId"] == parent.info.run_id for x in branches)
    assert all("flops_measurement" in x.data.metrics for x in branches)
    assert parent.data.metrics["flops_measurement_branching"] == pytest.approx(res["flops_measurement"])


def test_branching_refuses_fsdp_before_anything_runs(tmp_path, tiny_spec_dict):
    import copy

    from sweeps.errors import InvalidInput
    from sweeps.run.branching import run_branching
    from sweeps.spec import parse_spec

    d = copy.deepcopy(tiny_spec_dict)
    d["resources"] = {**d.get("resources", {}), "parallelism": "fsdp", "workers_per_trial": 2}
    with pytest.raises(InvalidInput, match="resources.parallelism: branching runs each branch in one process"):
        run_branching(parse_spec(d), tmp_path / "out")
    assert not (tmp_path / "out").exists()
