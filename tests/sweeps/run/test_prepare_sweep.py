"""A sweep prepared once (sweeps/run/prepare.py) into the values the run carries (sweeps/run/context.py):
the resolved spec and its workload config built once, the result a run returns as one type."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

import sweeps.launch.workload as workload_module
import sweeps.run.prepare as prepare_module
from sweeps.errors import InvalidInput
from sweeps.launch.workload import WorkloadFacts, with_inputs, workload_config
from sweeps.run.api import PreparedSweep, SweepResult, prepare_sweep
from sweeps.run.context import SweepRun
from sweeps.run.preflight import resolve_paths
from sweeps.settings import Settings
from sweeps.spec import parse_spec
from sweeps.store.state import SweepState


def test_a_result_is_the_seven_keys_the_cli_printed_in_their_order():
    r = SweepResult(
        ok=True, status="SUCCEEDED", sweep_id="s-1", cbs={"b_crit": 3.0}, output="/o", message="m", exit_code=None
    )
    d = r.to_dict()
    assert list(d) == ["ok", "status", "sweep_id", "cbs", "output", "message", "exit_code"]
    assert d == {
        "ok": True,
        "status": "SUCCEEDED",
        "sweep_id": "s-1",
        "cbs": {"b_crit": 3.0},
        "output": "/o",
        "message": "m",
        "exit_code": None,
    }
    assert d["cbs"] is r.cbs  # not copied
    assert SweepResult.stopped("s-2", Path("/x"), "stopped", 130).to_dict() == {
        "ok": False,
        "status": "STOPPED",
        "sweep_id": "s-2",
        "cbs": None,
        "output": "/x",
        "message": "stopped",
        "exit_code": 130,
    }
    with pytest.raises(AttributeError):
        r.ok = False  # frozen


def test_prepare_builds_the_workload_config_once_and_resolves_the_spec(tiny_spec_dict, tmp_path, monkeypatch):
    calls = []
    original = prepare_module.workload_config

    def counting(spec, **kw):
        calls.append(kw)
        return original(spec, **kw)

    monkeypatch.setattr(prepare_module, "workload_config", counting)
    d = copy.deepcopy(tiny_spec_dict)
    p = prepare_sweep(parse_spec(d), tmp_path / "out", tracking_uri=f"sqlite:///{tmp_path}/ml.db", sweep_id="prep-1")
    assert isinstance(p, PreparedSweep) and calls == [{}]
    assert p.output == (tmp_path / "out").resolve() and p.sweep_id == "prep-1" and not p.shared_storage
    assert p.storage_root == str(p.output) and p.tracking_uri == f"sqlite:///{tmp_path}/ml.db"
    assert p.fingerprint == parse_spec(d).fingerprint()  # of the spec as given
    assert p.spec == resolve_paths(parse_spec(d))
    assert p.workload == workload_config(p.spec)
    assert not (tmp_path / "out").exists()  # nothing is created
    with pytest.raises(InvalidInput, match="--sweep-id"):
        prepare_sweep(parse_spec(d), tmp_path / "out", sweep_id="bad id")


def test_the_workers_config_is_what_workload_config_gives_with_their_inputs(tiny_spec_dict, tmp_path):
    spec = resolve_paths(parse_spec(tiny_spec_dict))
    base = workload_config(spec)
    for data_path, shards in ((spec.data.path, None), (spec.data.path, "/root/data"), ("/elsewhere.txt", None)):
        assert with_inputs(base, data_path=data_path, shards=shards) == workload_config(
            spec, data_path=data_path, shards=shards
        )
    d = copy.deepcopy(tiny_spec_dict)
    d["data"] = {"shards": str(tmp_path / "shards")}
    sharded = parse_spec(d)
    for shards in (None, "/root/data"):
        assert with_inputs(workload_config(sharded), data_path="/x", shards=shards) == workload_config(
            sharded, data_path="/x", shards=shards
        )


def test_the_workload_facts_are_counted_once(tiny_spec_dict, monkeypatch):
    spec = resolve_paths(parse_spec(tiny_spec_dict))
    counted = []
    original = workload_module.flops_accounting

    def counting(s, w=None):
        counted.append(w)
        return original(s, w)

    monkeypatch.setattr(workload_module, "flops_accounting", counting)
    wc = workload_config(spec)
    facts = WorkloadFacts(spec, wc)
    assert facts.flops() == facts.flops() == original(spec)
    assert counted == [wc]
    assert facts.tokens_per_sequence() == float(spec.model.context_length_tokens)  # pretraining: packed


def test_a_run_hands_on_the_prepared_sweep(tiny_spec_dict, tmp_path):
    spec = resolve_paths(parse_spec(tiny_spec_dict))
    out = tmp_path / "out"
    state = SweepState(
        sweep_id="s",
        fingerprint="f",
        tracking_uri="u",
        experiment_id="1",
        parent_run_id="r",
        data_path=spec.data.path,
        ray_address=None,
        storage_root=str(out),
        optuna_storage="o",
    )
    settings = Settings(trial_runners=False)
    p = prepare_module.resumed_sweep(spec, out, state, settings)
    assert (p.sweep_id, p.fingerprint, p.storage_root, p.workload) == ("s", "f", str(out), workload_config(spec))
    assert p.settings is settings
    run = SweepRun(prepared=p, tracker=None, state=state, stop=None, concurrency=1, show_progress=False, resume=True)
    assert run.spec is spec and run.output == out and run.local
