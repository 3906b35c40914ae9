"""A full disk under a running sweep, then a resume once space is freed, on a real
filesystem that fills up (a tmpfs), the suite's Ray head and a real MLflow store.

The output folder lies on a small tmpfs. The first trial is held after its third milestone (of four,
the training loop's hold hook); then the test fills the filesystem with a file of its own and releases
the trial: it ends, the second trial cannot write its Train checkpoint, and the driver cannot write its
records. The run must end with one line naming the write that failed (exit 1) and a ``sweep.json``
that says the sweep crashed, with no temporary file beside it. Once the filler is removed,
``critbatch resume`` must end with every record agreeing: the reports, ``trials.json``, ``cbs.json``,
``sweep.json`` and MLflow.

A second sweep finds the disk too full for its trials' checkpoints but not for the driver's records:
every trial and the sweep must say "no space left on device", not torch's "unexpected pos".

Mounting a tmpfs needs root (CAP_SYS_ADMIN); elsewhere the tests are skipped.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import write_spec
from tests.sweeps.run.test_faults import ENV, children, spec_dict, stop_group, wait_for
from tests.sweeps.run.test_interrupts import start, tail
from workloads.testing.faults import HOLD_HOOKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # short sweeps, about 1-2 min each idle

#: the tmpfs's size: the prepared corpus (about 0.2 MB), the Tune and Optuna state and the checkpoints
#: of two trials fit with room to spare; the test fills the rest itself
TMPFS_SIZE = "6m"


@pytest.fixture
def small_fs(tmp_path):
    """A ``TMPFS_SIZE`` tmpfs mounted at ``tmp_path/fs`` (unmounted at the end); skips without the right to mount."""
    mnt = tmp_path / "fs"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE}", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip() or r.returncode}): needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(path: Path, leave_bytes: int = 0) -> None:
    """Write zeros to ``path`` until its filesystem has no space left, then give back ``leave_bytes`` (a
    disk nearly full: room for small writes, not for a large one)."""
    chunk = b"\0" * (64 * 1024)
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    with open(path, "ab", buffering=0) as f:  # the last partial page too
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError:
            pass
    if leave_bytes:
        os.truncate(path, max(0, path.stat().st_size - leave_bytes))


def report_rows(out: Path) -> dict[str, list[dict]]:
    """``OUT/reports/<trial id>.jsonl``: every report the driver received, per trial (a torn line, which
    a failed append used to leave for the next row to run into, fails the test)."""
    return {
        f.stem: [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
        for f in sorted((out / "reports").glob("*.jsonl"))
    }


def _rows_so_far(out: Path) -> list[list[str]]:
    return [f.read_text().splitlines() for f in (out / "reports").glob("*.jsonl")]


def _start_held_sweep(
    tmp_path: Path, small_fs: Path, name: str, resources: dict, hold_at: int, ray_head, mlflow_uri: str
):
    """``critbatch run`` of a two-trial sweep (B = 4 and 8, one at a time, a 100 kB corpus) into
    ``small_fs/out`` on the suite's head, every trial's first attempt held after milestone ``hold_at`` while the
    returned hold file exists: ``(out, tracking uri, log path, hold file, process)``."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(Path(spec_dict()["data"]["path"]).read_bytes()[:100_000])
    d = spec_dict(name=name)
    d["data"]["path"] = str(corpus)
    d["search"].update(batch_sizes_sequences=[4, 8], trials_per_batch_size=1)
    d["resources"] = {"max_concurrent_trials": 1, **resources}
    out, hold, log = small_fs / "out", tmp_path / "hold", tmp_path / "run.log"
    hold.touch()
    env = dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE=str(hold_at),
        CRITBATCH_TEST_HOLD_FILE=str(hold),
    )
    proc = start(
        [
            "run",
            str(write_spec(tmp_path, d)),
            "--output",
            str(out),
            "--tracking-uri",
            mlflow_uri,
            "--no-progress",
            "--address",
            ray_head.gcs_address,
        ],
        log,
        env=env,
    )
    return out, mlflow_uri, log, hold, proc


def test_disk_full_mid_sweep_then_resume_every_record_agrees(tmp_path, small_fs, ray_head, mlflow_uri):
    """Disk full while the second trial trains and the driver writes its records: exit 1 with one line
    "no space left on device while writing ...", ``sweep.json`` FAILED with that error and no
    ``sweep.json.tmp``; after freeing space, `critbatch resume` ends SUCCEEDED and every finished trial is
    COMPLETED in its reports, ``trials.json``, ``cbs.json`` and MLflow, each batch size in the analysis."""
    out, uri, log, hold, proc = _start_held_sweep(tmp_path, small_fs, "diskfull", {}, 2, ray_head, mlflow_uri)
    try:
        wait_for(
            lambda: any(len(rows) >= 3 for rows in _rows_so_far(out)),
            600,
            "the first trial's third report",
            diagnose=lambda: tail(log),
        )
        fill(small_fs / "filler")
        hold.unlink()
        rc = proc.wait(timeout=600)
    finally:
        stop_group(proc)
    text = log.read_text()
    assert rc == 1, tail(log)
    last = text.strip().splitlines()[-1]
    assert "no space left on device while writing" in last, tail(log)
    assert "sweep crashed" not in text and "EOFError" not in text, tail(log, 8000)
    state = json.loads((out / "sweep.json").read_text())
    assert state["status"] == "FAILED" and "no space left on device" in state["error"], state
    assert not list(out.glob("*.tmp")) and not list(out.glob(".*.tmp")), sorted(p.name for p in out.iterdir())
    for name in ("trials.json", "cbs.json"):  # each either absent or whole
        if (out / name).exists():
            json.loads((out / name).read_text())
    snapshots = list((out / "tune").rglob("experiment_state-*.json"))
    assert snapshots, sorted(str(p) for p in out.rglob("*"))
    for path in snapshots:  # Tune's snapshot whole too (it was once cut short: resume then failed)
        json.loads(path.read_text())

    (small_fs / "filler").unlink()
    r = start(
        ["resume", str(out), "--no-progress", "--address", ray_head.gcs_address], tmp_path / "resume.log", env=ENV
    )
    try:
        rc = r.wait(timeout=600)
    finally:
        stop_group(r)
    assert rc == 0, tail(tmp_path / "resume.log")
    rtext = (tmp_path / "resume.log").read_text()
    assert "Could not fetch metrics" not in text + rtext
    state = json.loads((out / "sweep.json").read_text())
    assert state["status"] == "SUCCEEDED" and "error" not in state, state
    trials = {t["trial_id"]: t for t in json.loads((out / "trials.json").read_text())}
    cbs = json.loads((out / "cbs.json").read_text())
    reports = report_rows(out)
    _, parents, kids = children(uri, "diskfull")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
    mlflow = {k.data.tags["critbatch.trial_id"]: k for k in kids}
    assert sorted(trials) == sorted(mlflow) == sorted(reports) and len(trials) == 2, (trials, mlflow, reports)
    for tid, t in trials.items():  # each record says the same of each trial
        finished = any(row.get("done") for row in reports[tid])
        assert finished and t["status"] == "COMPLETED", (tid, t["status"], reports[tid][-1])
        assert mlflow[tid].data.tags["critbatch.status"] == "COMPLETED" and mlflow[tid].info.status == "FINISHED"
        assert len(t["tokens"]) == 4, t
    assert cbs["trials"]["COMPLETED"] == 2 and not cbs["trials"].get("FAILED"), cbs["trials"]
    fitted = {row["batch_size_sequences"] for row in cbs["per_batch"] if row.get("loss_at_budget") is not None}
    assert fitted == {4, 8}, cbs["per_batch"]


def test_a_disk_too_full_for_checkpoints_is_named_on_every_trial_and_the_sweep(
    tmp_path, small_fs, ray_head, mlflow_uri
):
    """The disk nearly full before the trials write their checkpoints (room left for the driver's records,
    not for one more checkpoint): every trial FAILED with "no space left on device while writing the
    checkpoint to ..." in ``trials.json`` and its MLflow child's ``critbatch.error`` tag, and the sweep's
    message (the command line's, the MLflow parent's ``critbatch.message``) says so; before, each trial's
    error was torch's "unexpected pos" and the sweep said only "no trial completed"."""
    # the first trial waits after its first report, whose checkpoint shows how large one is
    out, uri, log, hold, proc = _start_held_sweep(
        tmp_path, small_fs, "diskfull-ckpt", {"max_failures": 0}, 0, ray_head, mlflow_uri
    )
    try:
        wait_for(
            lambda: any(rows for rows in _rows_so_far(out)),
            600,
            "the first trial's first report",
            diagnose=lambda: tail(log),
        )
        ckpt = next((out / "train").glob("train-*/ckpt-*/trial_state.pt"))  # about 0.5 MB
        fill(small_fs / "filler", leave_bytes=ckpt.stat().st_size - 16 * 1024)
        hold.unlink()
        rc = proc.wait(timeout=600)
    finally:
        stop_group(proc)
    text = log.read_text()
    assert rc == 1, tail(log)
    said = [line for line in text.splitlines() if "no trial completed" in line]
    assert said and all("no space left on device while writing the checkpoint to" in line for line in said), tail(log)
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 2 and {t["status"] for t in trials} == {"FAILED"}, trials
    for t in trials:  # the line that says it, not torch's "unexpected pos" alone
        assert "no space left on device while writing the checkpoint to " + str(out / "train") in t["error"], t
        assert "/trial_state.pt" in t["error"], t["error"]
    _, parents, kids = children(uri, "diskfull-ckpt")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "FAILED"
    assert "no space left on device while writing the checkpoint" in parents[0].data.tags["critbatch.message"]
    assert len(kids) == 2
    for k in kids:
        assert k.data.tags["critbatch.status"] == "FAILED" and k.info.status == "FAILED", k.data.tags
        first = k.data.tags["critbatch.error"].splitlines()[0]
        assert "no space left on device while writing the checkpoint to" in first, k.data.tags["critbatch.error"]
    state = json.loads((out / "sweep.json").read_text())
    assert state["status"] == "FAILED" and "error" not in state, state  # ended, its records written: no crash
