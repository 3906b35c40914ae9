import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.run.branching import _add_local_cbs, local_cbs_multiplier
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


def test_the_local_cbs_series_is_added_to_cbs_json_and_the_rest_kept_byte_for_byte(tmp_path):
    """``critbatch branch --output OUT`` on a sweep's OUT: ``cbs.json`` gains ``local_cbs`` (integers stay
    integers); every other key keeps its bytes."""
    fixture = Path(__file__).parents[1] / "analysis" / "fixtures" / "shakespeare_cbs.json"
    before = json.loads(fixture.read_text())
    before.pop("local_cbs", None)
    cbs_path = tmp_path / "cbs.json"
    cbs_path.write_text(json.dumps(before, indent=2))
    series = [
        {
            "tokens_seen": 0,
            "k_star": 4,
            "local_cbs_sequences": 32,
            "losses": {"1": 2.5, "2": 2.49, "4": 2.495},
            "tokens_seen_at_loss": {"1": 4096, "2": 4096, "4": 4096},
        },
        {"tokens_seen": 8192, "k_star": None, "local_cbs_sequences": None, "losses": {"1": None}},
    ]
    _add_local_cbs(cbs_path, series)
    after = json.loads(cbs_path.read_text())
    assert after.pop("local_cbs") == series
    assert json.dumps(after, indent=2) == json.dumps(before, indent=2)
    assert '"k_star": 4,' in cbs_path.read_text()


def test_a_base_run_from_a_sweep_takes_the_best_config_of_its_nearest_batch_size(tmp_path, tiny_spec_dict):
    """``critbatch branch --from RUN``: the sweep's ``cbs.json`` artifact gives the best configuration at the batch
    size nearest ``B0`` (in log), its LR carried to ``B0`` by the square-root rule and beta2 by the token half-life."""
    import math

    from sweeps.errors import InvalidInput
    from sweeps.run.branching import _base_hyperparameters
    from sweeps.spec import load_spec
    from workloads.api import beta2_from_half_life

    fixture = Path(__file__).parents[1] / "analysis" / "fixtures" / "shakespeare_cbs.json"

    class Client:
        def __init__(self, cbs: dict) -> None:
            self.cbs = cbs

        def download_artifacts(self, run_id: str, path: str, dst: str) -> str:
            assert (run_id, path) == ("run-1", "cbs.json")
            (Path(dst) / path).write_text(json.dumps(self.cbs))
            return str(Path(dst) / path)

    spec = load_spec(write_spec(tmp_path, tiny_spec_dict))
    cbs = json.loads(fixture.read_text())
    hp = _base_hyperparameters(spec, 10, "run-1", Client(cbs))  # B = 8 is the nearest to 10 (then 16)
    assert hp["lr_multiplier"] == 1.0 and hp["lr"] == pytest.approx(0.002121320343559643 * math.sqrt(10 / 8))
    assert hp["beta2"] == pytest.approx(beta2_from_half_life(32768.0, 10, spec.model.context_length_tokens))
    with pytest.raises(InvalidInput, match="no completed batch size"):
        _base_hyperparameters(spec, 10, "run-1", Client({**cbs, "per_batch": []}))
