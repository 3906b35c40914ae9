"""A real sweep with ``optimizer.name: adamw_8bit`` on CPU (bitsandbytes >= 0.50) through Tune, Optuna, Ray Train
and MLflow, no mocks: the name and the measured state bytes reach MLflow, trials.json and cbs.json."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, run_cli, write_spec

pytestmark = pytest.mark.slow


def test_an_adamw_8bit_sweep_runs_on_cpu_and_reports_its_8bit_state(tmp_path):
    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["name"] = "tiny-adamw8bit"
    # d_model 64: the attention and MLP weights (64 x 64 and larger) reach bitsandbytes' 4,096-element
    # threshold for 8-bit moments; the tiny spec's d_model 32 would leave most of them float32
    d["model"] = {"family": "llama", "d_model": 64, "n_layers": 1, "n_heads": 2, "context_length_tokens": 32}
    d["optimizer"] = {"name": "adamw_8bit"}
    d["search"]["batch_sizes_sequences"] = [8]
    d["search"]["lr_rules"] = ["sqrt"]
    d["resources"] = {"max_concurrent_trials": 1}
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = run_cli(["run", str(write_spec(tmp_path, d)), "--output", str(out), "--tracking-uri", uri, "--no-progress"],
                timeout_s=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr

    c = MlflowClient(uri)
    (trial,) = [x for x in c.search_runs([c.get_experiment_by_name("tiny-adamw8bit").experiment_id])
                if x.data.tags.get("critbatch.role") == "trial"]
    p, m = trial.data.params, trial.data.metrics
    assert trial.data.tags["critbatch.status"] == "COMPLETED"
    assert p["optimizer"] == "adamw_8bit"
    assert 0 < float(p["beta2"]) < 1  # AdamW8bit has a constant beta2: the half-life rule sets it
    # uint8 moments for the large tensors, float32 for the small ones (norms, and none else at this size)
    assert 2.0 < m["optimizer_state_bytes_per_param"] < 4.0, m["optimizer_state_bytes_per_param"]

    (rec,) = json.loads((out / "trials.json").read_text())
    assert rec["status"] == "COMPLETED"
    assert rec["optimizer_state_bytes_per_param"] == pytest.approx(m["optimizer_state_bytes_per_param"])
    cbs = json.loads((out / "cbs.json").read_text())
    assert cbs["optimizer"] == "adamw_8bit"
    assert cbs["optimizer_state_bytes_per_param"] == pytest.approx(m["optimizer_state_bytes_per_param"])
