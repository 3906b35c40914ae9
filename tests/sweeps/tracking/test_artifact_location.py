"""Where a new MLflow experiment's artifacts go: beside a SQLite store, never ``./mlruns`` of
whatever folder the command ran in (``sweeps.spec.identity.experiment_artifact_location``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweeps.spec.identity import ARTIFACTS_DIR_NAME, experiment_artifact_location

# ---- the rule --------------------------------------------------------------------------------------


def test_absolute_sqlite_store_gets_mlartifacts_beside_the_database(tmp_path):
    db = tmp_path / "dir" / "ml.db"
    assert experiment_artifact_location(f"sqlite:///{db}") == (tmp_path / "dir" / "mlartifacts").as_uri()
    assert experiment_artifact_location("sqlite:////abs/dir/ml.db") == "file:///abs/dir/mlartifacts"
    assert experiment_artifact_location(f"sqlite:///{db}?mode=ro") == (tmp_path / "dir" / "mlartifacts").as_uri()
    assert ARTIFACTS_DIR_NAME == "mlartifacts"


def test_relative_sqlite_store_is_resolved_against_the_working_directory_at_call_time(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    loc = experiment_artifact_location("sqlite:///sub/ml.db")
    assert loc == (tmp_path.resolve() / "sub" / "mlartifacts").as_uri()
    assert loc.startswith("file:///")
    assert experiment_artifact_location("sqlite:///ml.db") == (tmp_path.resolve() / "mlartifacts").as_uri()


@pytest.mark.parametrize(
    "uri",
    [
        "/abs/mlruns",
        "mlruns",
        "file:///abs/mlruns",  # file stores: MLflow's default is inside the store
        "http://127.0.0.1:5000",
        "https://mlflow.example.com",
        "databricks",  # servers decide
        "postgresql://u@h/db",
        "sqlite://",
        "sqlite:///:memory:",
        "",
        None,
    ],
)
def test_file_stores_servers_and_other_databases_get_no_location(uri):
    assert experiment_artifact_location(uri) is None


def test_the_tracker_passes_no_location_to_a_server(tiny_spec_dict):
    from sweeps.spec import parse_spec
    from sweeps.tracking.writer import create_experiment

    class Client:
        tracking_uri = "http://127.0.0.1:5000"

        def create_experiment(self, name, artifact_location=None, tags=None):
            self.got = (name, artifact_location)
            return "7"

    c = Client()
    assert create_experiment(c, parse_spec(tiny_spec_dict).experiment_name) == "7"
    assert c.got[1] is None


# ---- a real SQLite store, run from another folder ---------------------------------------------------


def test_tracker_artifacts_land_beside_the_sqlite_store_not_in_the_working_directory(
    tiny_spec_dict, mlflow_uri, tmp_path, monkeypatch
):
    from mlflow.tracking import MlflowClient

    from sweeps.spec import parse_spec
    from sweeps.tracking.writer import MlflowTracker

    store_dir = Path(mlflow_uri[len("sqlite:///") :]).parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    (out / "cbs.json").write_text('{"b_crit": 1}')
    monkeypatch.chdir(elsewhere)

    spec = parse_spec(tiny_spec_dict)
    client = MlflowClient(mlflow_uri)
    tracker = MlflowTracker(client, spec, "art-sweep")
    run_id = tracker.start_parent()
    assert tracker.finish("SUCCEEDED", {"b_crit": 1.0}, artifacts_dir=str(out), drain_s=5)

    exp = client.get_experiment(tracker.experiment_id)
    assert exp.artifact_location == (store_dir / "mlartifacts").as_uri()
    logged = store_dir / "mlartifacts" / run_id / "artifacts" / "cbs.json"  # MLflow: <location>/<run id>/artifacts
    assert logged.read_text() == '{"b_crit": 1}'
    assert list(elsewhere.iterdir()) == []

    # the branching command's experiment takes the same location; an existing experiment keeps its own
    from sweeps.run.branching import _log_branches
    from sweeps.spec import BranchSpec

    spec2 = parse_spec({**tiny_spec_dict, "name": "art-branching"})
    _log_branches(client, spec2, BranchSpec(), 8, {}, None, 0.0)
    assert (
        client.get_experiment_by_name(spec2.experiment_name).artifact_location == (store_dir / "mlartifacts").as_uri()
    )

    kept = client.create_experiment("kept", artifact_location=(tmp_path / "own").as_uri())
    spec3 = parse_spec({**tiny_spec_dict, "tracking": {**tiny_spec_dict.get("tracking", {}), "experiment": "kept"}})
    t3 = MlflowTracker(client, spec3, "art-kept")
    t3.start_parent()
    assert t3.experiment_id == kept
    assert client.get_experiment(kept).artifact_location == (tmp_path / "own").as_uri()
    assert list(elsewhere.iterdir()) == []
