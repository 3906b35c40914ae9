"""optimizer.name: the default dumps as before, the errors name their fields, the name reaches the trial
config, the MLflow params, trials.json and cbs.json (with the measured state bytes)."""

import copy
import json

import pytest
from typer.testing import CliRunner

from critbatch.main import app
from sweeps.analysis import TrialRecord, analyze_trials, finite_json
from sweeps.launch.trainable import trial_config
from sweeps.spec import SpecError, parse_spec
from sweeps.store.records import _record
from sweeps.tracking import schema
from workloads.config import TrialConfig

HP = {
    "batch_size_sequences": 8,
    "seed": 0,
    "lr": 1e-3,
    "lr_rule": "sqrt",
    "beta2": 0.99,
    "beta2_half_life_tokens": 4096.0,
}
FIXED_BETA2 = {"values": [0.99]}


def _with(d: dict, optimizer: dict | None = None, beta2: dict | None = None, **resources) -> dict:
    d = copy.deepcopy(d)
    if optimizer is not None:
        d.setdefault("optimizer", {}).update(optimizer)
    if beta2 is not None:
        d["search"]["beta2"] = beta2
    d.setdefault("resources", {}).update(resources)
    return d


def _error(d: dict) -> str:
    with pytest.raises(SpecError) as e:
        parse_spec(d)
    return str(e.value)


def test_the_default_is_adamw_and_dumps_and_fingerprints_as_before(tiny_spec_dict):
    s = parse_spec(tiny_spec_dict)
    assert s.optimizer.name == "adamw"
    # spec.yaml and the sweep id as before the field existed: the same keys
    assert set(s.model_dump()["optimizer"]) == {
        "beta1",
        "eps",
        "weight_decay",
        "grad_clip_norm",
        "divergence_loss_factor",
    }
    explicit = parse_spec(_with(tiny_spec_dict, optimizer={"name": "adamw"}))
    assert explicit == s and explicit.fingerprint() == s.fingerprint()
    assert trial_config(s, HP, "t0", data_path="x").optimizer.name == "adamw"


@pytest.mark.parametrize("name", ["adafactor", "sgd_momentum"])
def test_another_optimizer_dumps_its_name_and_reaches_the_trial_config(tiny_spec_dict, name):
    base = parse_spec(_with(tiny_spec_dict, beta2=FIXED_BETA2))
    s = parse_spec(_with(tiny_spec_dict, optimizer={"name": name}, beta2=FIXED_BETA2))
    assert s.model_dump()["optimizer"]["name"] == name
    assert s.fingerprint() != base.fingerprint()
    assert parse_spec(s.model_dump(mode="json")) == s  # round trip through spec.yaml
    c = trial_config(s, HP, "t0", data_path="x")
    assert c.optimizer.name == name
    assert TrialConfig.from_dict(json.loads(json.dumps(c.to_dict()))).optimizer.name == name  # as Ray sends it


@pytest.mark.parametrize("name", ["adafactor", "sgd_momentum"])
@pytest.mark.parametrize("beta2", [{"half_life_tokens": [2048, 16384]}, {"values": [0.95, 0.99]}])
def test_searching_beta2_of_an_optimizer_without_one_is_refused(tiny_spec_dict, name, beta2):
    msg = _error(_with(tiny_spec_dict, optimizer={"name": name}, beta2=beta2))
    assert f"optimizer.name={name} has no beta2: set search.beta2.values to a single value" in msg


@pytest.mark.parametrize("beta2", [FIXED_BETA2, {"half_life_tokens": [4096, 4096]}])
def test_a_fixed_beta2_is_accepted_for_adafactor(tiny_spec_dict, beta2):
    assert parse_spec(_with(tiny_spec_dict, optimizer={"name": "adafactor"}, beta2=beta2)).optimizer.name == "adafactor"


def test_adamw_8bit_is_accepted_on_cpu_and_searches_beta2(tiny_spec_dict):
    # bitsandbytes >= 0.50 runs AdamW8bit on CPU tensors: no GPU needed; beta2 is constant, so it is searched
    spec = parse_spec(_with(tiny_spec_dict, optimizer={"name": "adamw_8bit"}))
    assert (spec.optimizer.name, spec.optimizer.reads_beta2, spec.resources.gpus_per_worker) == ("adamw_8bit", True, 0)


@pytest.mark.parametrize(
    "name,refused", [("adafactor", True), ("adamw_8bit", True), ("sgd_momentum", False), ("adamw", False)]
)
def test_fsdp_takes_adamw_and_sgd_momentum_only(tiny_spec_dict, name, refused):
    d = _with(
        tiny_spec_dict,
        optimizer={"name": name},
        beta2=FIXED_BETA2,
        parallelism="fsdp",
        workers_per_trial=2,
        gpus_per_worker=1.0,
    )
    d["search"]["batch_sizes_sequences"] = [4, 8, 16]
    if refused:
        assert f"optimizer.name={name} cannot run with resources.parallelism: fsdp" in _error(d)
    else:
        assert parse_spec(d).optimizer.name == name


def test_an_unknown_optimizer_is_refused_naming_the_field(tiny_spec_dict):
    msg = _error(_with(tiny_spec_dict, optimizer={"name": "lion"}))
    assert "optimizer.name" in msg and "adafactor" in msg


def test_the_spec_and_the_worker_know_the_same_optimizers():
    from sweeps.spec.sections import OPTIMIZER_NAMES, OptimizerSpec
    from workloads import config
    from workloads.train import optim

    assert OPTIMIZER_NAMES == config.OPTIMIZER_NAMES
    assert all(OptimizerSpec(name=n).reads_beta2 == optim.reads_beta2(n) for n in OPTIMIZER_NAMES)


def test_the_optimizer_is_a_trial_param_and_its_state_bytes_a_metric():
    assert schema.PARAM_OPTIMIZER == "optimizer" and schema.PARAM_OPTIMIZER in schema.TRIAL_PARAMS
    assert "optimizer_state_bytes_per_param" in schema.METRIC_KEYS


def test_records_keep_the_first_reports_state_bytes_and_cbs_json_their_median(tmp_path):
    curve = [
        {"tokens_seen": 100, "val_loss": 3.0, "optimizer_state_bytes_per_param": 4.0, "trainable_params": 1234},
        {"tokens_seen": 200, "val_loss": 2.0},
    ]
    cfg = {"batch_size_sequences": 8, "seed": 0, **HP}
    rec = _record("t1", cfg, curve, curve[-1], "COMPLETED")
    assert rec.optimizer_state_bytes_per_param == 4.0 and rec.trainable_params == 1234
    assert TrialRecord.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec  # through trials.json
    old = {k: v for k, v in rec.to_dict().items() if k != "optimizer_state_bytes_per_param"}
    assert TrialRecord.from_dict(old).optimizer_state_bytes_per_param is None  # an older sweep's trials.json
    assert _record("t2", cfg, curve[1:], curve[-1], "COMPLETED").optimizer_state_bytes_per_param is None

    def trial(i: int, b: int, bytes_: float | None) -> TrialRecord:
        tokens = [1e3, 2e3, 4e3, 8e3]
        return TrialRecord(
            trial_id=f"t{i}",
            batch_size_sequences=b,
            seed=0,
            group_id=f"g{i}",
            status="COMPLETED",
            hyperparameters={"lr": 1e-3},
            tokens=tokens,
            val_loss=[4.0 - 0.3 * k * 8 / b for k in range(4)],
            flops=[t * 10 for t in tokens],
            optimizer_state_bytes_per_param=bytes_,
        )

    trials = [trial(0, 4, 8.0), trial(1, 8, 8.5), trial(2, 16, 9.5), trial(3, 16, None)]
    cbs = analyze_trials(trials, context_length_tokens=32, reference_batch=8)
    assert cbs["optimizer_state_bytes_per_param"] == 8.5
    assert "n_params" not in cbs  # not reported: critbatch plan falls back to --params or flops/6
    with_n = [TrialRecord(**{**t.to_dict(), "trainable_params": 1234.0}) for t in trials]
    assert analyze_trials(with_n, context_length_tokens=32, reference_batch=8)["n_params"] == 1234.0
    no_bytes = [trial(i, b, None) for i, b in enumerate([4, 8, 16])]
    assert "optimizer_state_bytes_per_param" not in analyze_trials(
        no_bytes, context_length_tokens=32, reference_batch=8
    )
    # critbatch analyze --trials keeps the driver's optimizer and recomputes the median from trials.json
    (tmp_path / "cbs.json").write_text(json.dumps(finite_json({**cbs.to_json_dict(), "optimizer": "sgd_momentum"})))
    (tmp_path / "trials.json").write_text(json.dumps(finite_json([t.to_dict() for t in trials])))
    r = CliRunner().invoke(app, ["analyze", "--trials", str(tmp_path / "trials.json")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["optimizer"] == "sgd_momentum" and out["optimizer_state_bytes_per_param"] == 8.5


def test_a_trial_run_logs_the_optimizer_param_and_the_state_bytes_metric(tiny_spec_dict, tmp_path):
    from mlflow.tracking import MlflowClient

    from sweeps.tracking.writer import MlflowTracker

    s = parse_spec(_with(tiny_spec_dict, optimizer={"name": "sgd_momentum"}, beta2=FIXED_BETA2))
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    tracker = MlflowTracker(client, s, "sweep-1")
    tracker.start_parent()
    tracker.trial_started("t1", {**HP, "lr_multiplier": 1.0}, {})
    tracker.trial_result(
        "t1", {"tokens_seen": 256, "val_loss": 3.0, "beta2": float("nan"), "optimizer_state_bytes_per_param": 4.0}
    )
    assert tracker.outbox.flush()
    run = client.get_run(tracker._run_id("t1"))
    assert run.data.params["optimizer"] == "sgd_momentum"
    assert run.data.metrics["optimizer_state_bytes_per_param"] == 4.0
    assert "beta2" not in run.data.metrics  # NaN: no beta2 for sgd_momentum, not logged
