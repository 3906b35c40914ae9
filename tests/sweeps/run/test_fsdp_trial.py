"""One real Ray Train trial of 2 workers under ``resources.parallelism: fsdp`` (Tune, Train, MLflow, no mocks)."""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, run_cli, write_spec

pytestmark = pytest.mark.slow


def test_an_fsdp_trial_completes_with_its_params_noise_scale_and_checkpoint(tmp_path):
    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["name"] = "tiny-fsdp"
    d["search"]["batch_sizes_sequences"] = [8]
    d["resources"] = {"max_concurrent_trials": 1, "workers_per_trial": 2, "cpus_per_worker": 0.9,
                      "parallelism": "fsdp", "micro_batch_size_sequences_max": 2}
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = run_cli(["run", str(write_spec(tmp_path, d)), "--output", str(out), "--tracking-uri", uri, "--no-progress"],
                timeout_s=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    c = MlflowClient(uri)
    (trial,) = [x for x in c.search_runs([c.get_experiment_by_name("tiny-fsdp").experiment_id])
                if x.data.tags.get("critbatch.role") == "trial"]
    p = trial.data.params
    assert (p["parallelism"], p["compile"], p["activation_checkpointing"], p["mixed_precision"]) == (
        "fsdp", "False", "False", "auto")
    assert (p["micro_batch_size_sequences"], p["grad_accum_steps"], p["workers"]) == ("2", "2", "2")
    assert trial.data.tags["critbatch.status"] == "COMPLETED"
    assert trial.data.metrics["b_simple"] > 0  # estimated over worker groups
    (ck,) = list((out / "checkpoints").iterdir())
    assert (ck / "config.json").is_file()
    assert json.loads((out / "trials.json").read_text())
