"""Who owns a sweep: two runs racing for one output folder, a resume of a live sweep, and a changed spec
under an existing sweep id (real Ray, Optuna and MLflow)."""

from __future__ import annotations

import json
import os
import signal

import optuna
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import invoke_cli, run_cli, write_spec
from tests.sweeps.run.test_faults import children, spec_dict, stop_group, wait_for
from tests.sweeps.run.test_interrupts import start, tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # each 1-2 min idle


def test_two_runs_racing_for_one_new_folder(tmp_path, ray_head, mlflow_uri):
    """Two `critbatch run` into one new folder, started back to back: exactly one claims it; the other
    exits 2 before its sweep starts (once it has connected to Ray, which comes first), naming the winner;
    sweep.json is the winner's, MLflow has its run only; a `critbatch resume` of the live sweep is refused
    too. Once it is stopped, its corpus changes: the
    resume is refused too (exit 2, naming data.path and both hashes), since it would train the remaining
    trials on other data."""
    import shutil

    d = spec_dict(name="race")
    d["resources"] = {
        "max_concurrent_trials": 1
    }  # one trial runner: two starting at once on 2 cores cost ~7 s a sweep (docs/benchmarks.md, the suite)
    corpus = tmp_path / "corpus.txt"
    shutil.copy(d["data"]["path"], corpus)
    d["data"]["path"] = str(corpus)
    out, uri = tmp_path / "out", mlflow_uri
    spec = write_spec(tmp_path, d)
    procs = {
        sid: start(
            [
                "run",
                str(spec),
                "--output",
                str(out),
                "--tracking-uri",
                uri,
                "--no-progress",
                "--sweep-id",
                sid,
                "--address",
                ray_head.gcs_address,
            ],
            tmp_path / f"{sid}.log",
        )
        for sid in ("race-a", "race-b")
    }
    try:
        loser = wait_for(
            lambda: next((s for s, p in procs.items() if p.poll() is not None), None),
            600,
            "one of the two runs to exit",
            diagnose=lambda: "\n".join(tail(tmp_path / f"{s}.log", 1500) for s in procs),
        )
        winner = next(s for s in procs if s != loser)
        text = (tmp_path / f"{loser}.log").read_text()
        assert procs[loser].returncode == 2, text
        assert f"sweep '{winner}'" in text and str(out) in text, text
        assert "Traceback" not in text
        assert procs[winner].poll() is None, tail(tmp_path / f"{winner}.log")
        # the winner's claim, then its running sweep: the folder is its own from the start
        assert json.loads((out / "sweep.json").read_text())["sweep_id"] == winner
        wait_for(
            lambda: json.loads((out / "sweep.json").read_text()).get("status") == "RUNNING",
            600,
            "the winner's sweep to start",
            diagnose=lambda: tail(tmp_path / f"{winner}.log"),
        )
        r = invoke_cli(["resume", str(out), "--no-progress", "--address", "127.0.0.1:9"])  # refused before Ray
        assert r.returncode == 2 and f"sweep '{winner}'" in r.stderr and "is running there" in r.stderr, r.stderr
        os.killpg(procs[winner].pid, signal.SIGINT)
        assert procs[winner].wait(timeout=600) == 130, tail(tmp_path / f"{winner}.log")
    finally:
        for p in procs.values():
            stop_group(p)
    state = json.loads((out / "sweep.json").read_text())
    assert state["sweep_id"] == winner and state["status"] == "STOPPED"
    _, parents, _ = children(uri, "race")
    assert [p.data.tags["critbatch.sweep_id"] for p in parents] == [winner]
    import hashlib

    pinned = state["inputs"]["data.path"]
    assert pinned == {"path": str(corpus), "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}
    with open(corpus, "a") as f:
        f.write("ROMEO:\nA line the first trials never saw.\n")
    r = invoke_cli(["resume", str(out), "--no-progress", "--address", "127.0.0.1:9"])  # refused before Ray
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"data.path {corpus} changed since the sweep" in r.stderr and pinned["sha256"] in r.stderr, r.stderr
    assert hashlib.sha256(corpus.read_bytes()).hexdigest() in r.stderr
    assert json.loads((out / "sweep.json").read_text())["status"] == "STOPPED"  # untouched


def test_a_changed_spec_under_one_sweep_id_is_refused(tmp_path, ray_head, mlflow_uri):
    """A sweep id is bound to its spec's fingerprint: in the shared storage root (a retried job with a
    different spec used to resume the old sweep and report its batch sizes under the new spec), and in
    MLflow (a local run). Exit 2, before Ray, nothing created. The first sweep also seeds its search
    with an initial point, which reaches Optuna as an enqueued trial and MLflow as a tagged child."""
    storage = tmp_path / "storage"
    uri = mlflow_uri
    d = spec_dict(name="bind")
    d["search"].update(
        batch_sizes_sequences=[4],
        trials_per_batch_size=1,
        initial_points=[{"lr_rule": "linear", "lr_multiplier": 1.5, "beta2_half_life_tokens": 4096.0}],
    )
    d["resources"] = {"max_concurrent_trials": 1, "storage_path": str(storage)}
    first = tmp_path / "out1"
    r = run_cli(
        [
            "run",
            str(write_spec(tmp_path, d, "a.yaml")),
            "--output",
            str(first),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "bind-1",
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        timeout_s=400,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert json.loads((storage / "bind-1" / "critbatch-sweep.json").read_text())["sweep_id"] == "bind-1"

    c, parents, kids = children(uri, "bind")
    assert len(parents) == 1 and len(kids) == 1
    assert kids[0].data.tags["critbatch.initial_point"] == "0"
    assert (kids[0].data.params["lr_rule"], float(kids[0].data.params["lr_multiplier"])) == ("linear", 1.5)
    study = optuna.load_study(study_name="bind-1-B4", storage=f"sqlite:///{first / 'optuna.db'}")
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.user_attrs["critbatch.initial_point"] == 0 and trial.state == optuna.trial.TrialState.COMPLETE

    changed = dict(d, search={**d["search"], "batch_sizes_sequences": [8]})
    for name, spec_d, out in [
        ("shared storage", changed, tmp_path / "out2"),
        ("MLflow", {**changed, "resources": {"max_concurrent_trials": 1}}, tmp_path / "out3"),
    ]:
        r = invoke_cli(
            [
                "run",
                str(write_spec(tmp_path, spec_d, "b.yaml")),
                "--output",
                str(out),
                "--tracking-uri",
                uri,
                "--sweep-id",
                "bind-1",
                "--no-progress",
                "--address",
                "127.0.0.1:9",
            ]
        )  # refused before Ray
        assert r.returncode == 2, (name, r.stdout[-2000:], r.stderr[-3000:])
        assert "--sweep-id 'bind-1' already runs another spec" in r.stderr, (name, r.stderr)
        assert "resuming" not in r.stdout + r.stderr and not out.exists(), name
    assert len(MlflowClient(uri).search_runs([parents[0].info.experiment_id])) == 2  # nothing new
