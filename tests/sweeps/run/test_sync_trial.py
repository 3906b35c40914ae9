"""One real Ray Train trial of 2 DiLoCo replicas (``resources.sync``) through Tune, Train and MLflow, no mocks."""

from __future__ import annotations

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, run_cli, write_spec

pytestmark = pytest.mark.slow


def test_a_diloco_trial_completes_with_its_sync_params_and_comm_metrics(tmp_path):
    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["name"] = "tiny-diloco"
    d["search"]["batch_sizes_sequences"] = [8]
    d["resources"] = {"max_concurrent_trials": 1, "workers_per_trial": 2, "cpus_per_worker": 0.9,
                      "micro_batch_size_sequences_max": 2, "sync": {"mode": "diloco", "every_steps": 4}}
    out, uri = tmp_path / "out", f"sqlite:///{tmp_path / 'mlflow.db'}"
    r = run_cli(["run", str(write_spec(tmp_path, d)), "--output", str(out), "--tracking-uri", uri, "--no-progress"],
                timeout_s=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    c = MlflowClient(uri)
    (trial,) = [x for x in c.search_runs([c.get_experiment_by_name("tiny-diloco").experiment_id])
                if x.data.tags.get("critbatch.role") == "trial"]
    p, m = trial.data.params, trial.data.metrics
    assert (p["sync"], p["sync_every_steps"], p["replicas"], p["outer_lr"], p["outer_momentum"]) == (
        "diloco", "4", "2", "0.7", "0.9")
    assert trial.data.tags["critbatch.status"] == "COMPLETED"
    steps = 8192 // (8 * 32)  # budget / tokens per step
    assert m["syncs"] == steps // 4
    assert m["comm_bytes_total"] == pytest.approx(m["comm_bytes_per_step"] * steps)
    assert m["comm_time_s"] > 0 and "b_simple" not in m  # no global gradient: no noise scale
    hist = c.get_metric_history(trial.info.run_id, "syncs")
    assert [h.value for h in sorted(hist, key=lambda h: h.step)] == [2, 4, 6, 8]  # four milestones
    assert (out / "checkpoints").is_dir() and list((out / "checkpoints").iterdir())
