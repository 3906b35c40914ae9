import json

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.run.branching import local_cbs_multiplier
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
    d["branch"] = {
        "points_fraction": [0.0, 0.5, 1.0],
        "multipliers": [0.5, 1, 2],
        "window_tokens": 1024,
        "epsilon": 0.01,
    }
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
        assert p["tokens_seen_at_loss"] == {
            str(k): p["tokens_seen"] + 1024 for k in (0.5, 1.0, 2.0)
        }  # every branch ends on the window
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


def test_branching_refuses_a_window_a_branch_cannot_end_on(tmp_path, tiny_spec_dict):
    """A branch stops after the first step at or past the window's end; with B0 = 8 of 32 tokens,
    k = 2 steps 512 tokens, so a window of 1280 would end it at 1536 tokens while k = 0.5 and 1 end at 1280,
    and k* would compare losses taken at different tokens. Refused (exit 2) before anything runs."""
    d = dict(tiny_spec_dict)
    d["branch"] = {"points_fraction": [0.0, 0.5], "multipliers": [0.5, 1, 2], "window_tokens": 1280}
    spec = write_spec(tmp_path, d)
    r = CliRunner().invoke(
        app,
        ["branch", str(spec), "--output", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path / 'ml.db'}"],
    )
    assert r.exit_code == 2, r.output
    assert (
        "branch.window_tokens 1280 is not a multiple of the optimizer step of multiplier(s) 2 (512 tokens per step)"
        in r.output
    )
    assert "use a multiple of 512 tokens" in r.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "ml.db").exists()
