"""Interrupts and resumes that lose nothing: Ctrl-C, SIGTERM, a forced quit, against real Ray, Optuna, MLflow.

Each interrupted sweep is resumed with ``critbatch resume`` and must end exactly as an uninterrupted
run of the same spec: the same ``cbs.json`` (trial and run ids aside), every trial's curve complete in
``trials.json`` and in MLflow, every MLflow run ended.

Reports lost between Ray Train and Tune are made certain, not hoped for: every trial waits after its
second milestone (the training loop's hold hook, while a file exists); once Tune has that report the
driver is frozen (SIGSTOP) and the hold released, so the trials go on training, until a trial's Ray
Train checkpoint is two milestones ahead of what Tune has received; then the stop signal is sent and
the driver continued. Those reports exist only in the checkpoint, and a resume must deliver them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, write_spec
from tests.harness import copy_mlflow_store
from tests.sweeps.run.test_faults import (
    CLI,
    ENV,
    children,
    result_rows,
    spec_dict,
    start_ray_head,
    stop_group,
    stop_head,
    wait_for,
)
from workloads.testing.faults import HOLD_HOOKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # each 1-3 min idle (a sweep, an interrupt, a resume)

MILESTONE_TOKENS = 1024
MILESTONES = [MILESTONE_TOKENS * (i + 1) for i in range(8)]
#: keys of cbs.json that name runs, not results (trial ids are random; MLflow ids and paths differ)
#: keys that identify a run or the process that ran it, not its results: ``provenance`` records the driver's
#: environment (its ``OMP_NUM_THREADS`` is what the launching process had: a test's subprocess inherits whatever
#: earlier tests in the same pytest process left in ``os.environ``)
IDENTITY_KEYS = {
    "sweep_id",
    "mlflow",
    "best_checkpoint",
    "trial_id",
    "group_id",
    "trial_ids_to_target",
    "trial_ids_at_budget",
    "provenance",
}


def interrupt_spec(name: str) -> dict:
    """2 batch sizes x 1 trial, 8 milestones of 1024 tokens, one trial at a time: the first is held and cut
    mid-way, the second starts only in the resume (more trials would prove nothing more; two at a time
    cost ~7 s a sweep on 2 cores, two trial runners starting at once)."""
    d = spec_dict(name=name)
    d["eval"] = {"milestones": 8, "eval_tokens": 1024}
    d["search"].update(batch_sizes_sequences=[4, 8], trials_per_batch_size=1)
    d["resources"] = {"max_concurrent_trials": 1}
    return d


def results_only(o):
    """``cbs.json`` without the keys that identify runs rather than results."""
    if isinstance(o, dict):
        return {k: results_only(v) for k, v in o.items() if k not in IDENTITY_KEYS}
    if isinstance(o, list):
        return [results_only(v) for v in o]
    return o


def hold_env(hold: Path) -> dict:
    """The environment in which every trial's first attempt waits after its second milestone while ``hold``
    exists (``workloads/testing/faults.py::hold_from_env``, named by ``CRITBATCH_TEST_MILESTONE_HOOKS``); creates ``hold``."""
    hold.touch()
    return dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE="1",
        CRITBATCH_TEST_HOLD_FILE=str(hold),
    )


def start(args: list[str], log_path: Path, env: dict | None = None) -> subprocess.Popen:
    """``critbatch ARGS`` in its own process group (as a terminal runs it), its output to a file."""
    log = open(log_path, "w")
    return subprocess.Popen(
        CLI + args, cwd=ROOT, env=env or ENV, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def tail(path: Path, n: int = 4000) -> str:
    return path.read_text()[-n:] if path.is_file() else ""


def tune_tokens(out: Path) -> dict[str, float]:
    """The last tokens value Tune recorded per trial (its result.json files)."""
    seen: dict[str, float] = {}
    for r in result_rows(out):
        if "tokens_seen" in r:
            seen[r["trial_id"]] = max(seen.get(r["trial_id"], 0.0), float(r["tokens_seen"]))
    return seen


def checkpoint_tokens(out: Path) -> dict[str, float]:
    """The tokens seen in each trial's newest checkpoint (``OUT/train/train-<trial id>/``: a trial runner's
    ``ckpt-<n>``, or Ray Train's ``checkpoint_<time>`` under ``CRITBATCH_TRIAL_RUNNERS=0``)."""
    import torch

    got: dict[str, float] = {}
    train = out / "train"
    for f in [*train.glob("train-*/checkpoint_*/trial_state.pt"), *train.glob("train-*/ckpt-*/trial_state.pt")]:
        try:
            state = torch.load(f, weights_only=False, map_location="cpu")
        except Exception:  # noqa: BLE001 - being written, or just replaced by the next one
            continue
        tid = f.parent.parent.name[len("train-") :]
        got[tid] = max(got.get(tid, 0.0), float(state["loop"]["tokens_seen"]))
    return got


def freeze_until_reports_are_only_in_a_checkpoint(proc: subprocess.Popen, out: Path, log: Path, hold: Path) -> str:
    """Wait until Tune has the two reports of a trial held at its second milestone, SIGSTOP the driver,
    release the hold, and wait until a trial's Train checkpoint is two milestones past what Tune has;
    returns that trial's id (the driver stays stopped)."""
    wait_for(
        lambda: any(v >= 2 * MILESTONE_TOKENS for v in tune_tokens(out).values()),
        900,
        "a trial with two milestones in Tune",
        diagnose=lambda: tail(log),
    )
    os.kill(proc.pid, signal.SIGSTOP)
    frozen = tune_tokens(out)
    hold.unlink()

    def ahead():
        ck = checkpoint_tokens(out)
        return next((t for t, v in ck.items() if t in frozen and v >= frozen[t] + 2 * MILESTONE_TOKENS), None)

    try:
        return wait_for(ahead, 600, "a Train checkpoint two milestones ahead of Tune", interval_s=0.5)
    except BaseException:
        os.kill(proc.pid, signal.SIGCONT)
        raise


def resume_to_the_end(out: Path, log: Path, *, address: str | None = None) -> None:
    """``critbatch resume OUT`` (on the cluster at ``address`` if given); it must exit 0 within 30 minutes."""
    r = start(["resume", str(out), "--no-progress", *(["--address", address] if address else [])], log)
    try:
        assert r.wait(timeout=400) == 0, tail(log)
    finally:
        stop_group(r)


def assert_stopped_and_resumable(out: Path, uri: str, experiment: str) -> None:
    state = json.loads((out / "sweep.json").read_text())
    assert state["status"] == "STOPPED", state
    c, parents, kids = children(uri, experiment)
    assert len(parents) == 1
    assert parents[0].data.tags["critbatch.status"] == "STOPPED" and parents[0].info.status == "KILLED"
    assert kids and all(k.info.status != "RUNNING" for k in kids)
    assert {k.data.tags["critbatch.status"] for k in kids} <= {"COMPLETED", "STOPPED"}
    assert "STOPPED" in {k.data.tags["critbatch.status"] for k in kids}  # a trial was cut mid-way


def assert_same_result_as_uninterrupted(out: Path, uri: str, experiment: str, reference: dict) -> None:
    cbs = json.loads((out / "cbs.json").read_text())
    assert cbs["trials"]["COMPLETED"] == 2
    assert results_only(cbs) == results_only(reference["cbs"])
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 2 and len({t["trial_id"] for t in trials}) == 2
    for t in trials:  # every curve whole: no milestone lost with the interrupt, none twice
        assert t["status"] == "COMPLETED" and t["tokens"] == [float(m) for m in MILESTONES], t
    c, parents, kids = children(uri, experiment)
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
    assert parents[0].info.status == "FINISHED"
    assert sorted(k.data.tags["critbatch.trial_id"] for k in kids) == sorted(t["trial_id"] for t in trials)
    for k in kids:
        assert k.info.status == "FINISHED" and k.data.tags["critbatch.status"] == "COMPLETED"
        assert "critbatch.error" not in k.data.tags, k.data.tags  # the stop's note does not outlive the resume
        steps = [m.step for m in c.get_metric_history(k.info.run_id, "val_loss")]
        assert sorted(steps) == MILESTONES, (k.data.tags["critbatch.trial_id"], steps)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ray_head, mlflow_template) -> dict:
    """The uninterrupted sweep every interrupted one must reproduce (on the suite's Ray head)."""
    tmp = tmp_path_factory.mktemp("reference")
    out, uri = tmp / "out", copy_mlflow_store(mlflow_template, tmp / "ml.db")
    spec = write_spec(tmp, interrupt_spec("intr-ref"))
    proc = start(
        [
            "run",
            str(spec),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        tmp / "run.log",
    )
    try:
        rc = proc.wait(timeout=400)
    finally:
        stop_group(proc)
    assert rc == 0, tail(tmp / "run.log")
    return {"cbs": json.loads((out / "cbs.json").read_text()), "out": out}


def test_ctrl_c_mid_trial_stops_cleanly_and_resume_ends_as_uninterrupted(tmp_path, reference, ray_head, mlflow_uri):
    """SIGINT to the run's process group (a terminal's Ctrl-C; Ray started in-process) while reports sit
    only in a Train checkpoint: exit 130, every run STOPPED; `critbatch resume` (on the suite's head: where
    it runs is not the point) delivers those reports and ends with the uninterrupted sweep's result."""
    out, uri, log = tmp_path / "out", mlflow_uri, tmp_path / "run.log"
    spec = write_spec(tmp_path, interrupt_spec("intr-int"))
    hold = tmp_path / "hold"
    proc = start(
        ["run", str(spec), "--output", str(out), "--tracking-uri", uri, "--no-progress"], log, env=hold_env(hold)
    )
    try:
        tid = freeze_until_reports_are_only_in_a_checkpoint(proc, out, log, hold)
        os.killpg(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGCONT)
        rc = proc.wait(timeout=600)
    finally:
        stop_group(proc)
    assert rc == 130, tail(log)
    assert "stopping the sweep cleanly" in log.read_text()
    assert tune_tokens(out)[tid] < checkpoint_tokens(out)[tid]  # reports only the checkpoint holds
    assert_stopped_and_resumable(out, uri, "intr-int")
    resume_to_the_end(out, tmp_path / "resume.log", address=ray_head.gcs_address)
    assert_same_result_as_uninterrupted(out, uri, "intr-int", reference)


def test_sigterm_mid_trial_on_a_cluster_then_resume_ends_as_uninterrupted(tmp_path, reference, ray_head, mlflow_uri):
    """SIGTERM to the driver (what `kill` and Kubernetes send) on an external Ray head (the suite's: the
    hold hook reaches the trials through the job's runtime env), reports again only in a Train
    checkpoint: exit 143, every run STOPPED; the resume ends with the uninterrupted result."""
    hold = tmp_path / "hold"
    address = ray_head.gcs_address
    out, uri, log = tmp_path / "out", mlflow_uri, tmp_path / "run.log"
    spec = write_spec(tmp_path, interrupt_spec("intr-term"))
    proc = start(
        ["run", str(spec), "--output", str(out), "--tracking-uri", uri, "--no-progress", "--address", address],
        log,
        env=hold_env(hold),
    )
    try:
        tid = freeze_until_reports_are_only_in_a_checkpoint(proc, out, log, hold)
        os.kill(proc.pid, signal.SIGTERM)
        os.kill(proc.pid, signal.SIGCONT)
        rc = proc.wait(timeout=300)
    finally:
        stop_group(proc)
        hold.unlink(missing_ok=True)
    assert rc == 143, tail(log)
    assert tune_tokens(out)[tid] < checkpoint_tokens(out)[tid]
    assert_stopped_and_resumable(out, uri, "intr-term")
    resume_to_the_end(out, tmp_path / "resume.log", address=address)
    assert_same_result_as_uninterrupted(out, uri, "intr-term", reference)


def test_a_second_ctrl_c_force_quits_and_the_sweep_still_resumes(tmp_path, reference, mlflow_uri):
    """Ctrl-C, then Ctrl-C again while the driver is stopping, the trials held mid-way: it quits at once
    (exit 130, no analysis), every run is still ended STOPPED, and the resume ends with the uninterrupted
    result."""
    hold = tmp_path / "hold"
    head, address = start_ray_head(env=hold_env(hold))  # its own: a force-quit driver may leave actors behind
    try:
        out, uri, log = tmp_path / "out", mlflow_uri, tmp_path / "run.log"
        spec = write_spec(tmp_path, interrupt_spec("intr-force"))
        proc = start(
            ["run", str(spec), "--output", str(out), "--tracking-uri", uri, "--no-progress", "--address", address], log
        )
        try:
            wait_for(
                lambda: any(v >= 2 * MILESTONE_TOKENS for v in tune_tokens(out).values()),
                900,
                "a trial with two milestones in Tune",
                diagnose=lambda: tail(log),
            )
            os.killpg(proc.pid, signal.SIGINT)
            wait_for(lambda: "stopping the sweep cleanly" in log.read_text(), 60, "the clean stop to begin")
            os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(timeout=300)
        finally:
            stop_group(proc)
            hold.unlink(missing_ok=True)
        assert rc == 130, tail(log)
        assert "force-quitting" in log.read_text()
        assert not (out / "cbs.json").exists()  # no analysis on a force-quit
        assert_stopped_and_resumable(out, uri, "intr-force")
        resume_to_the_end(out, tmp_path / "resume.log", address=address)
    finally:
        stop_head(head)
    assert_same_result_as_uninterrupted(out, uri, "intr-force", reference)
