"""Three kinds of trial in one real comparison (``arms``) through Tune, Optuna, Ray Train and MLflow on
the suite's Ray head, no mocks: 2 FSDP workers, 2 DiLoCo replicas, and ``adamw_8bit`` on CPU
(bitsandbytes >= 0.50). One trial per arm; each arm is a whole sweep under ``OUT/arms/NAME`` whose
trial run carries ``critbatch.arm``. (These were three single-trial sweeps; one comparison pays the
CLI's start-up once.)"""

from __future__ import annotations

import json

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, run_cli, write_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # ~2-3 min idle

_TWO_WORKERS = {
    "max_concurrent_trials": 1,
    "workers_per_trial": 2,
    "cpus_per_worker": 0.9,
    "micro_batch_size_sequences_max": 2,
}


@pytest.fixture(scope="module")
def kinds(tmp_path_factory, ray_head, mlflow_template):
    from tests.harness import copy_mlflow_store

    tmp = tmp_path_factory.mktemp("kinds")
    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["data"]["path"] = str(ROOT / d["data"]["path"])
    d["name"] = "tiny-kinds"
    d["search"]["batch_sizes_sequences"] = [8]
    d["arms"] = [
        {"name": "fsdp", "resources": dict(_TWO_WORKERS, parallelism="fsdp")},
        {"name": "diloco", "resources": dict(_TWO_WORKERS, sync={"mode": "diloco", "every_steps": 4})},
        # d_model 64: the attention and MLP weights (64 x 64 and larger) reach bitsandbytes' 4,096-element
        # threshold for 8-bit moments; the tiny spec's d_model 32 would leave most of them float32
        {
            "name": "adamw-8bit",
            "optimizer": {"name": "adamw_8bit"},
            "search": {"lr_rules": ["sqrt"]},
            "model": {"family": "llama", "d_model": 64, "n_layers": 1, "n_heads": 2, "context_length_tokens": 32},
            "resources": {"max_concurrent_trials": 1},
        },
    ]
    out, uri = tmp / "out", copy_mlflow_store(mlflow_template, tmp / "mlflow.db")
    r = run_cli(
        [
            "run",
            str(write_spec(tmp, d)),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        timeout_s=540,
        cwd=tmp,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    c = MlflowClient(uri)
    runs = c.search_runs([c.get_experiment_by_name("tiny-kinds").experiment_id], max_results=100)
    trials = {x.data.tags["critbatch.arm"]: x for x in runs if x.data.tags.get("critbatch.role") == "trial"}
    assert sorted(trials) == ["adamw-8bit", "diloco", "fsdp"]
    return {"out": out, "client": c, "trials": trials}


def test_arms_of_one_resource_shape_share_their_trial_runners_and_another_shape_starts_its_own(kinds):
    """fsdp and diloco (2 workers of 0.9 CPU) run in the runners the fsdp arm started: a runner's Ray Train
    run folder (``train/runner-*``) exists only in the first arm of each shape; every trial's checkpoints
    are in its own arm's folder whatever runner trained it."""
    arms = kinds["out"] / "arms"
    runs = {a: sorted(p.name for p in (arms / a / "train").glob("runner-*")) for a in ("fsdp", "diloco", "adamw-8bit")}
    assert len(runs["fsdp"]) == 1 and runs["diloco"] == [] and len(runs["adamw-8bit"]) == 1, runs
    for a in runs:
        assert len(list((arms / a / "train").glob("train-*/ckpt-*"))) == 1, a


def test_an_fsdp_trial_completes_with_its_params_noise_scale_and_checkpoint(kinds):
    trial, out = kinds["trials"]["fsdp"], kinds["out"] / "arms" / "fsdp"
    p = trial.data.params
    assert (p["parallelism"], p["compile"], p["activation_checkpointing"], p["mixed_precision"]) == (
        "fsdp",
        "False",
        "False",
        "auto",
    )
    assert (p["micro_batch_size_sequences"], p["grad_accum_steps"], p["workers"]) == ("2", "2", "2")
    assert trial.data.tags["critbatch.status"] == "COMPLETED"
    assert trial.data.metrics["b_simple"] > 0  # estimated over worker groups
    (ck,) = list((out / "checkpoints").iterdir())
    assert json.loads((ck / "config.json").read_text())["hidden_size"] == 32  # the arm's model, saved whole
    (rec,) = json.loads((out / "trials.json").read_text())
    assert rec["status"] == "COMPLETED" and rec["batch_size_sequences"] == 8 and rec["tokens"][-1] == 8192


def test_a_diloco_trial_completes_with_its_sync_params_and_comm_metrics(kinds):
    trial, c = kinds["trials"]["diloco"], kinds["client"]
    p, m = trial.data.params, trial.data.metrics
    assert (p["sync"], p["sync_every_steps"], p["replicas"], p["outer_lr"], p["outer_momentum"]) == (
        "diloco",
        "4",
        "2",
        "0.7",
        "0.9",
    )
    assert trial.data.tags["critbatch.status"] == "COMPLETED"
    steps = 8192 // (8 * 32)  # budget / tokens per step
    assert m["syncs"] == steps // 4
    assert m["comm_bytes_total"] == pytest.approx(m["comm_bytes_per_step"] * steps)
    assert m["comm_time_s"] > 0 and "b_simple" not in m  # no global gradient: no noise scale
    hist = c.get_metric_history(trial.info.run_id, "syncs")
    assert [h.value for h in sorted(hist, key=lambda h: h.step)] == [2, 4, 6, 8]  # four milestones
    (ck,) = list((kinds["out"] / "arms" / "diloco" / "checkpoints").iterdir())
    assert (ck / "config.json").is_file()


def test_an_adamw_8bit_sweep_runs_on_cpu_and_reports_its_8bit_state(kinds):
    trial, out = kinds["trials"]["adamw-8bit"], kinds["out"] / "arms" / "adamw-8bit"
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
    # the other arms kept AdamW's full-precision moments: 8 bytes per parameter
    other = kinds["trials"]["fsdp"].data
    assert other.params["optimizer"] == "adamw" and other.metrics["optimizer_state_bytes_per_param"] > 7.9
