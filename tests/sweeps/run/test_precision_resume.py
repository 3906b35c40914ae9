"""A ``search.precision`` sweep stopped in the middle of its second wave and resumed ends with the answer of
the same spec run uninterrupted: the test session's precision sweep (``tests/sweeps/conftest.py``),
on the suite's Ray head.

The stop is placed, not timed: the second wave's batch size (32, added by the first wave's analysis) is the
only one whose trials wait after their second milestone (``CRITBATCH_TEST_HOLD_BATCH_SIZES``, while a hold
file exists), so the first wave runs freely and the signal arrives while every trial of the second is held.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.harness import copy_mlflow_store
from tests.sweeps.conftest import precision_spec_dict
from tests.sweeps.run.test_faults import ENV, children, stop_group, wait_for
from tests.sweeps.run.test_interrupts import results_only, start, tail
from workloads.testing.faults import HOLD_HOOKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # the reference sweep if not yet run, a stop, a resume

#: the batch size the first wave adds (two batch sizes give no fit: the range widens upwards)
WAVE_2_BATCH = 32
MILESTONES = [2048.0, 4096.0, 6144.0, 8192.0]  # tiny.yaml: 8192 tokens, 4 milestones


def started(out: Path, batch: int) -> dict[str, int]:
    """The trials of ``batch`` the driver has seen start (``OUT/reports/``), with how many reports each sent."""
    got = {}
    for params in (out / "reports").glob("*.params.json"):
        try:
            config = json.loads(params.read_text())
        except (OSError, ValueError):  # being written
            continue
        if config.get("batch_size_sequences") == batch:
            reports = params.with_name(params.name.replace(".params.json", ".jsonl"))
            got[params.name.split(".")[0]] = len(reports.read_text().splitlines()) if reports.is_file() else 0
    return got


def curves(trials: list[dict]) -> list[tuple]:
    """Each trial as what it ran and what it measured, in a stable order (trial ids left out)."""
    return sorted(
        (
            t["batch_size_sequences"],
            t["seed"],
            t["hyperparameters"]["lr"],
            t["status"],
            tuple(t["tokens"]),
            tuple(t["val_loss"]),
        )
        for t in trials
    )


def test_a_precision_sweep_stopped_mid_second_wave_resumes_to_the_uninterrupted_answer(
    tmp_path, precision_sweep, ray_head, mlflow_template
):
    """Ctrl-C (SIGINT to the driver) once the first wave's analysis has added batch size 32 and both its trials
    are held after their second of four milestones: exit 130, the sweep STOPPED, ``cbs.json`` says
    ``interrupted``. ``critbatch resume`` then finishes those trials, ends the second wave (the searcher's
    saved waves and targets carry over) and writes the uninterrupted run's ``cbs.json`` (b_crit, its interval,
    status, targets, every wave and why it stopped; ids aside), ``precision.json`` and trials."""
    hold = tmp_path / "hold"
    hold.touch()
    env = dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE="1",
        CRITBATCH_TEST_HOLD_FILE=str(hold),
        CRITBATCH_TEST_HOLD_BATCH_SIZES=str(WAVE_2_BATCH),
    )
    out, log = tmp_path / "out", tmp_path / "run.log"
    uri = copy_mlflow_store(mlflow_template, tmp_path / "mlflow.db")
    spec = write_spec(tmp_path, precision_spec_dict())
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
        log,
        env=env,
    )
    try:
        wait_for(
            lambda: (lambda s: len(s) == 2 and min(s.values()) >= 2)(started(out, WAVE_2_BATCH)),
            300,
            "both trials of the second wave held after their second milestone",
            interval_s=0.2,
            diagnose=lambda: tail(log),
        )
        os.kill(proc.pid, signal.SIGINT)
        wait_for(
            lambda: "stopping the sweep cleanly" in log.read_text(),
            60,
            "the clean stop to begin",
            diagnose=lambda: tail(log),
        )
        hold.unlink()  # the held workers go on to their next report, where the stop reaches them
        rc = proc.wait(timeout=300)
    finally:
        stop_group(proc)
        hold.unlink(missing_ok=True)
    assert rc == 130, tail(log)
    assert json.loads((out / "sweep.json").read_text())["status"] == "STOPPED"
    saved = json.loads((out / "precision.json").read_text())  # the first wave's decision, made before the stop
    assert saved["outcome"] is None and [a["batch_size_sequences"] for a in saved["waves"][0]["added"]] == [32]
    assert json.loads((out / "cbs.json").read_text())["precision"]["stopped_because"] == "interrupted"
    cut = [t for t in json.loads((out / "trials.json").read_text()) if t["batch_size_sequences"] == WAVE_2_BATCH]
    assert len(cut) == 2 and all(t["status"] == "STOPPED" and len(t["tokens"]) < len(MILESTONES) for t in cut), cut

    r = start(["resume", str(out), "--no-progress", "--address", ray_head.gcs_address], tmp_path / "resume.log")
    try:
        assert r.wait(timeout=300) == 0, tail(tmp_path / "resume.log")
    finally:
        stop_group(r)

    reference = precision_sweep.read("cbs.json")
    cbs = json.loads((out / "cbs.json").read_text())
    for key in ("b_crit", "b_crit_ci", "status", "targets", "precision"):  # the answer, named first for the message
        assert results_only(cbs.get(key)) == results_only(reference.get(key)), key
    assert cbs["precision"]["stopped_because"] in ("met", "max_trials") and cbs["trials"]["COMPLETED"] == 6
    assert results_only(cbs) == results_only(reference)
    assert json.loads((out / "precision.json").read_text()) == precision_sweep.read("precision.json")
    trials = json.loads((out / "trials.json").read_text())
    stop = min(json.loads((out / "precision.json").read_text())["targets"])  # token reallocation's stop
    for t in trials:  # every curve whole (the second wave's to its stop): none lost, none twice
        n = len(t["tokens"]) if t["batch_size_sequences"] == WAVE_2_BATCH else len(MILESTONES)
        assert t["tokens"] == MILESTONES[:n] and (n == len(MILESTONES) or t["val_loss"][-1] <= stop), t
    assert curves(trials) == curves(precision_sweep.read("trials.json"))
    _, parents, kids = children(uri, "transfer")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
    assert parents[0].data.tags["critbatch.precision.stopped_because"] == cbs["precision"]["stopped_because"]
    assert sorted(k.data.tags["critbatch.status"] for k in kids) == ["COMPLETED"] * 6
