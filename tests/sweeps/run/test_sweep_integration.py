"""One tiny sweep through real Ray Tune, Ray Train, Optuna RDB storage and MLflow (no mocks)."""

from __future__ import annotations

import json
import sys

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, invoke_cli, run_cli, write_spec
from tests.harness import copy_mlflow_store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(300),
]  # each ~10-60 s idle; the module fixture's sweep is in the first

CLI = [sys.executable, "-m", "critbatch"]


def _run(args, cwd=ROOT, timeout=600):
    return run_cli(args, timeout_s=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory, ray_head, mlflow_template):
    """The tiny spec's sweep (3 batch sizes x 1 trial) on the suite's Ray head, run from an empty
    working directory (``cwd``: a sweep must write nothing there)."""
    tmp = tmp_path_factory.mktemp("sweep")
    import yaml

    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["data"]["path"] = str(ROOT / d["data"]["path"])
    d["resources"] = {
        "max_concurrent_trials": 1
    }  # one trial runner: two starting at once on 2 cores cost ~7 s a sweep (docs/benchmarks.md, the suite)
    spec = write_spec(tmp, d)
    out = tmp / "out"
    uri = copy_mlflow_store(mlflow_template, tmp / "mlflow.db")
    cwd = tmp / "cwd"
    cwd.mkdir()
    r = _run(
        [
            "run",
            str(spec),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "tiny-it",
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        cwd=cwd,
    )
    return {"result": r, "out": out, "uri": uri, "spec": spec, "tmp": tmp, "cwd": cwd}


def test_a_sweep_writes_nothing_in_its_working_directory(tiny_sweep):
    assert tiny_sweep["result"].returncode == 0, tiny_sweep["result"].stderr[-4000:]
    assert sorted(p.name for p in tiny_sweep["cwd"].iterdir()) == []
    # and outside its output folder, only its stores: the MLflow db and the artifacts next to it
    assert {p.name for p in tiny_sweep["tmp"].iterdir()} <= {"spec.yaml", "out", "mlflow.db", "mlartifacts", "cwd"}


def test_sweep_succeeds_and_writes_cbs_json(tiny_sweep):
    r = tiny_sweep["result"]
    assert r.returncode == 0, r.stdout + r.stderr
    cbs = json.loads((tiny_sweep["out"] / "cbs.json").read_text())
    for key in (
        "b_crit",
        "b_crit_tokens",
        "cbs_20",
        "s_min",
        "e_min",
        "target_loss",
        "per_batch",
        "targets",
        "b_simple",
    ):
        assert key in cbs
    assert cbs["trials"]["COMPLETED"] == 3
    assert [p["batch_size_sequences"] for p in cbs["per_batch"]] == [4, 8, 16]
    trials = json.loads((tiny_sweep["out"] / "trials.json").read_text())
    trials = trials["trials"] if isinstance(trials, dict) else trials
    for p in cbs["per_batch"]:
        # the reported best configuration is the configuration of that batch size's best trial at the budget
        mine = [t for t in trials if t["batch_size_sequences"] == p["batch_size_sequences"]]
        assert len(mine) == 1, mine
        assert p["best_config_at_budget"]["lr_rule"] == mine[0]["hyperparameters"]["lr_rule"]
        assert p["best_config_at_budget"]["lr"] == pytest.approx(mine[0]["hyperparameters"]["lr"])
        assert 0 < p["loss_at_budget"] < 5.6
    # either a number inside the swept range, or a clear statement that the knee is outside it
    if cbs["b_crit"] is not None:
        assert 4 <= cbs["b_crit"] <= 16
        assert cbs["b_crit_tokens"] == pytest.approx(cbs["b_crit"] * 32)
        assert "critical batch size b_crit" in r.stdout
        # the 20 % CBS's interval: b_crit's mapped through 0.2 b + 1.2 B0 (B0 = 8), printed beside it
        lo, hi = [None if x is None else 0.2 * x + 9.6 for x in cbs["b_crit_ci"]]
        assert cbs["cbs_20_ci"] == [pytest.approx(lo), pytest.approx(hi) if hi is not None else None]
        assert f"[{lo:.1f}, {f'{hi:.1f}' if hi is not None else 'unbounded'}] (95% CI)" in r.stdout
    else:
        assert cbs["message"] and cbs["message"] in r.stdout
    html = (tiny_sweep["out"] / "report.html").read_text()
    assert html.count("data:image/png;base64") >= 3


def test_mlflow_has_one_parent_and_one_child_per_trial(tiny_sweep):
    c = MlflowClient(tiny_sweep["uri"])
    exp = c.get_experiment_by_name("tiny")
    runs = c.search_runs([exp.experiment_id], max_results=1000)
    parents = [x for x in runs if x.data.tags.get("critbatch.role") == "sweep"]
    children = [x for x in runs if x.data.tags.get("critbatch.role") == "trial"]
    assert len(parents) == 1 and len(children) == 3
    parent = parents[0]
    assert parent.info.status == "FINISHED" and parent.data.tags["critbatch.status"] == "SUCCEEDED"
    assert parent.data.tags["critbatch.sweep_id"] == "tiny-it"
    arts = {a.path for a in c.list_artifacts(parent.info.run_id)}
    assert {"cbs.json", "report.html", "trials.json", "spec.yaml", "plots"} <= arts
    assert "trials_completed" in parent.data.metrics
    for ch in children:
        assert ch.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert ch.info.status == "FINISHED" and ch.data.tags["critbatch.status"] == "COMPLETED"
        for p in (
            "batch_size_sequences",
            "micro_batch_size_sequences",
            "grad_accum_steps",
            "workers",
            "lr",
            "lr_rule",
            "beta2",
            "beta2_half_life_tokens",
            "seed",
            "flops_convention",
        ):
            assert p in ch.data.params
        hist = c.get_metric_history(ch.info.run_id, "val_loss")
        assert [m.step for m in sorted(hist, key=lambda m: m.step)] == [2048, 4096, 6144, 8192]
        for key in ("train_loss", "flops", "lr", "tokens_per_s", "b_simple"):
            assert c.get_metric_history(ch.info.run_id, key), key
        # the trial's start-up: from its start to its first optimizer step, the Ray part first
        startup, ray_part = ch.data.metrics["startup_s"], ch.data.metrics["startup_ray_s"]
        assert 0 < ray_part < startup < 600


def test_later_trials_run_in_the_tune_process_of_a_finished_one(tiny_sweep):
    # 3 trials, 2 at a time, no pruning: the third reuses a finished trial's process (TuneConfig.reuse_actors)
    pids = {}
    for f in (tiny_sweep["out"] / "reports").glob("*.jsonl"):
        rows = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        pids[f.stem] = {r["pid"] for r in rows}
    assert len(pids) == 3 and all(len(p) == 1 for p in pids.values())
    # at least one trial ran in a process a finished trial left (how many depends on timing: under transfer
    # the batch sizes wait for their anchors, so one relay process may serve all three)
    assert len(set().union(*pids.values())) < 3


def test_optuna_study_per_batch_size_in_rdb(tiny_sweep):
    url = f"sqlite:///{tiny_sweep['out'] / 'optuna.db'}"
    names = sorted(s.study_name for s in optuna.get_all_study_summaries(url))
    assert names == ["tiny-it-B16", "tiny-it-B4", "tiny-it-B8"]
    for n in names:
        study = optuna.load_study(study_name=n, storage=url)
        assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE]
        # the default placement (transfer): each trial is a point critbatch enqueued, its LR offset from the
        # batch size's centre and the carried beta2 half-life
        assert set(study.trials[0].params) == {"lr_offset_octaves", "beta2_half_life_tokens"}
        assert "critbatch.transfer_point" in study.trials[0].user_attrs


def test_output_folder_of_another_sweep_is_refused(tiny_sweep):
    r = invoke_cli(
        [
            "run",
            str(tiny_sweep["spec"]),
            "--output",
            str(tiny_sweep["out"]),
            "--tracking-uri",
            tiny_sweep["uri"],
            "--address",
            "127.0.0.1:9",
        ]
    )  # refused before Ray: in this process
    assert r.returncode == 2
    assert "already holds sweep 'tiny-it'" in r.stderr and "critbatch resume" in r.stderr
    c = MlflowClient(tiny_sweep["uri"])
    exp = c.get_experiment_by_name("tiny")
    assert len(c.search_runs([exp.experiment_id], "tags.`critbatch.role` = 'sweep'")) == 1


def test_sweep_where_every_trial_diverges_ends_failed(tmp_path, ray_head, mlflow_uri):
    import yaml

    d = yaml.safe_load((ROOT / "tests" / "specs" / "tiny.yaml").read_text())
    d["name"] = "tiny-diverge"
    d["search"].update(
        batch_sizes_sequences=[4, 8], base_lr=9.0, lr_rules=["none"], lr_multiplier=[1.0, 1.0], beta2={"values": [0.99]}
    )
    d["optimizer"] = {"grad_clip_norm": None}
    d["schedule"]["warmup_tokens"] = 0
    d["resources"] = {
        "max_concurrent_trials": 1
    }  # one trial runner: two starting at once on 2 cores cost ~7 s a sweep (docs/benchmarks.md, the suite)
    spec = write_spec(tmp_path, d)
    uri = mlflow_uri
    r = _run(
        [
            "run",
            str(spec),
            "--output",
            str(tmp_path / "out"),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ]
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "no trial completed" in r.stdout
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name("tiny-diverge")
    runs = c.search_runs([exp.experiment_id])
    parent = [x for x in runs if x.data.tags.get("critbatch.role") == "sweep"][0]
    assert parent.data.tags["critbatch.status"] == "FAILED" and parent.info.status == "FAILED"
    children = [x for x in runs if x.data.tags.get("critbatch.role") == "trial"]
    assert sorted(x.data.tags["critbatch.status"] for x in children) == ["DIVERGED", "DIVERGED"]
    assert all(x.info.status != "RUNNING" for x in runs)
    cbs = json.loads((tmp_path / "out" / "cbs.json").read_text())
    assert cbs["trials"]["DIVERGED"] == 2 and cbs["b_crit"] is None


def test_cbs_json_steps_are_the_minimum_over_trials_and_analyze_trials_reproduces_it(tiny_sweep):
    from tests.cbs_checks import assert_analyze_trials_reproduces_cbs_json, assert_steps_are_minimum_over_trials

    assert tiny_sweep["result"].returncode == 0
    assert assert_steps_are_minimum_over_trials(tiny_sweep["out"]) >= 3
    assert_analyze_trials_reproduces_cbs_json(tiny_sweep["out"])


#: what may differ between two runs of one spec on one revision (the rest of ``cbs.json`` must not): the
#: MLflow store and run ids (``mlflow``), Ray Tune's trial ids (random per run) under every key that holds
#: them (``group_id`` is the Tune id of a search group's first trial, ``sweeps/search/searcher.py``), and the
#: best checkpoint's folder (``best_checkpoint``: its path holds the output folder and a trial id). Nothing
#: else in ``cbs.json`` is an id or a time.
RUN_TO_RUN_KEYS = ("mlflow", "best_checkpoint", "trial_id", "trial_ids_to_target", "trial_ids_at_budget", "group_id")


def _without(value, keys):
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def _differences(a, b, path="cbs.json") -> list[str]:
    """The paths where ``a`` and ``b`` differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def test_the_same_spec_run_twice_gives_the_same_cbs_json(tiny_sweep, ray_head, mlflow_template):
    # the suite's tiny sweep once more, same spec and sweep id, into a fresh folder and MLflow store, this time
    # with the other launcher (a Ray Train run per trial, chosen by the driver's environment: the spec and its
    # fingerprint stay the same): only the RUN_TO_RUN_KEYS may differ (CPU training is deterministic:
    # workloads/train/determinism.py), whichever launcher ran the trials
    import os

    assert tiny_sweep["result"].returncode == 0
    tmp = tiny_sweep["tmp"] / "again"
    tmp.mkdir()
    uri = copy_mlflow_store(mlflow_template, tmp / "mlflow.db")
    r = run_cli(
        [
            "run",
            str(tiny_sweep["spec"]),
            "--output",
            str(tmp / "out"),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "tiny-it",
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        timeout_s=600,
        env=dict(os.environ, CRITBATCH_TRIAL_RUNNERS="0"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    first = json.loads((tiny_sweep["out"] / "cbs.json").read_text())
    second = json.loads((tmp / "out" / "cbs.json").read_text())
    assert first["mlflow"]["parent_run_id"] != second["mlflow"]["parent_run_id"]  # two runs, not one read twice
    diff = _differences(_without(first, RUN_TO_RUN_KEYS), _without(second, RUN_TO_RUN_KEYS))
    assert not diff, "\n".join(diff[:20])
    assert first["b_crit_ci"] is not None and first["per_batch"]  # the comparison covered numbers


def test_cbs_json_and_the_parent_run_say_what_the_numbers_were_computed_with(tiny_sweep):
    import importlib.metadata
    import platform

    cbs = json.loads((tiny_sweep["out"] / "cbs.json").read_text())
    prov = cbs["provenance"]
    assert prov["python"] == platform.python_version()
    assert prov["packages"] == {
        n: importlib.metadata.version(n) for n in ("torch", "ray", "transformers", "optuna", "mlflow")
    }
    # the tiny spec's 1-CPU workers: one intra-op thread, deterministic algorithms on CPU (warnings only)
    assert prov["worker"] == {
        "device": "cpu",
        "torch_num_threads": 1,
        "deterministic_algorithms": True,
        "deterministic_warn_only": True,
    }
    c = MlflowClient(tiny_sweep["uri"])
    parent = c.get_run(cbs["mlflow"]["parent_run_id"])
    tags = parent.data.tags
    assert tags["critbatch.provenance.packages.torch"] == prov["packages"]["torch"]
    assert tags["critbatch.provenance.python"] == prov["python"]
    assert tags["critbatch.provenance.worker.torch_num_threads"] == "1"
    assert tags["critbatch.provenance.worker.deterministic_algorithms"] == "True"
    assert tags["critbatch.provenance.driver.omp_num_threads"] == str(prov["driver"]["omp_num_threads"])
    # and every worker says it did so: its first report's metrics, on its trial's run
    for rid in cbs["mlflow"]["child_runs"].values():
        m = c.get_run(rid).data.metrics
        assert m["torch_num_threads"] == 1 and m["deterministic_algorithms"] == 1.0
