"""A retried job (the same ``--sweep-id`` and ``resources.storage_path``, a new ``--output``: a RayJob's retry,
the REST service's jobs, the KubeRay entrypoint) goes through the gate a resume goes through
(``sweeps.store.inputs.check_inputs_unchanged``): refused when an input's content changed, resumed when it did
not, and a trial that completed before the driver died is not run again. Real Ray (the suite's head),
Optuna and MLflow."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, write_spec
from tests.sweeps.run.test_faults import ENV, children, spec_dict, wait_for
from tests.sweeps.run.test_interrupts import results_only, start, tail
from workloads.testing.faults import HOLD_HOOKS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # about 2-3 min idle

#: the tiny spec's model as a transformers config file (what the operator's retry changed: intermediate_size)
HF_CONFIG = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}


def _reports(out: Path) -> dict[str, dict]:
    """``{trial id: {"batch", "rows", "ended"}}`` of the driver's report log (``OUT/reports``)."""
    got: dict[str, dict] = {}
    for params in (out / "reports").glob("*.params.json"):
        tid = params.name[: -len(".params.json")]
        log, end = out / "reports" / f"{tid}.jsonl", out / "reports" / f"{tid}.end.json"
        rows = [json.loads(x) for x in log.read_text().splitlines() if x.strip()] if log.is_file() else []
        got[tid] = {
            "batch": json.loads(params.read_text())["batch_size_sequences"],
            "rows": rows,
            "ended": json.loads(end.read_text()) if end.is_file() else None,
        }
    return got


def _runs(uri: str, experiment: str) -> list[tuple[str, str]]:
    c, parents, kids = children(uri, experiment)
    return sorted((r.info.run_id, r.info.status) for r in parents + kids)


def test_a_retried_job_is_refused_when_an_input_changed_and_resumes_without_rerunning_when_none_did(
    tmp_path, ray_head, mlflow_uri
):
    """Driver 1 (`run --sweep-id retry-1`, shared storage) is killed with SIGKILL 2 s after batch size 8 (the
    transfer anchor, so the first) completed; batch size 4 (held after its second of four milestones, should it
    get that far) has not.
    The corpus and the model config change: driver 2 (a new --output) exits 2 naming both inputs with both
    hashes each, before anything starts (no new MLflow run, no output folder). Put back: driver 3 resumes the
    sweep from the shared storage, completes batch size 4 and does not run batch size 8 again (its final
    report exists once, in driver 1's log); its sweep.json pins the same inputs, and its answer is that of the
    same spec run uninterrupted."""
    address, uri = ray_head.gcs_address, mlflow_uri
    corpus, cfg = tmp_path / "inputs" / "corpus.txt", tmp_path / "inputs" / "config.json"
    corpus.parent.mkdir()
    shutil.copy(ROOT / "data" / "tinyshakespeare" / "input.txt", corpus)
    cfg.write_text(json.dumps(HF_CONFIG))
    d = spec_dict(name="retry")
    d["data"]["path"] = str(corpus)
    d["model"] = {"hf_config": str(cfg), "context_length_tokens": 32}
    d["search"].update(batch_sizes_sequences=[4, 8], trials_per_batch_size=1)
    d["resources"] = {"max_concurrent_trials": 1, "storage_path": str(tmp_path / "storage")}
    spec = write_spec(tmp_path, d)

    def args(out: Path) -> list[str]:
        return [
            "run",
            str(spec),
            "--output",
            str(out),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "retry-1",
            "--no-progress",
            "--address",
            address,
        ]

    out1, out2, hold = tmp_path / "out1", tmp_path / "out2", tmp_path / "hold"
    hold.touch()
    env = dict(
        ENV,
        CRITBATCH_TEST_MILESTONE_HOOKS=HOLD_HOOKS,
        CRITBATCH_TEST_HOLD_AT_MILESTONE="1",
        CRITBATCH_TEST_HOLD_FILE=str(hold),
        CRITBATCH_TEST_HOLD_BATCH_SIZES="4",
    )
    first = start(args(out1), tmp_path / "driver1.log", env=env)

    def completed_trial():
        return next((t for t, v in _reports(out1).items() if v["batch"] == 8 and v["ended"] == {"failed": False}), None)

    try:
        completed = wait_for(
            completed_trial,
            600,
            "batch size 8 to complete",
            interval_s=0.1,
            diagnose=lambda: tail(tmp_path / "driver1.log"),
        )
        # well inside Tune's snapshot period (TUNE_GLOBAL_CHECKPOINT_S, 5 s), which left a trial that had just
        # completed RUNNING in the snapshot and a retry ran it again (before sweeps._compat.snapshot_when_a_trial_ends)
        time.sleep(2)
        assert first.poll() is None, tail(tmp_path / "driver1.log")
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        first.kill()
        hold.unlink(missing_ok=True)
    final_rows = [r for r in _reports(out1)[completed]["rows"] if r.get("done")]
    assert len(final_rows) == 1 and final_rows[0]["tokens_seen"] == 8192
    pinned = json.loads((out1 / "sweep.json").read_text())["inputs"]
    assert set(pinned) == {"data.path", "model.hf_config"}
    assert json.loads((tmp_path / "storage" / "retry-1" / "critbatch-sweep.json").read_text())["inputs"] == pinned

    # the operator's retry: the corpus and the model config changed between the two drivers
    original = corpus.read_bytes()
    corpus.write_bytes(original + b"ROMEO:\nA line the first trials never saw.\n")
    cfg.write_text(json.dumps(dict(HF_CONFIG, intermediate_size=128)))
    before = _runs(uri, "retry")
    r = run_cli(args(out2), timeout_s=300)
    text = r.stdout + r.stderr
    assert r.returncode == 2, text[-4000:]
    new_corpus = hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert (
        f"data.path {corpus} changed since sweep 'retry-1' started (recorded in {tmp_path / 'storage' / 'retry-1'}"
        f"/critbatch-sweep.json) (sha256 {pinned['data.path']['sha256']} then, {new_corpus} now)"
    ) in text, text
    m = re.search(
        rf"model\.hf_config {re.escape(str(cfg))} changed since sweep 'retry-1' started \(recorded in "
        rf".*?\) \(sha256 {pinned['model.hf_config']['sha256']} then, ([0-9a-f]{{64}}) now\)",
        text,
    )
    assert m and m.group(1) != pinned["model.hf_config"]["sha256"], text
    assert "resuming" not in text and "Traceback" not in text
    assert not out2.exists()
    assert _runs(uri, "retry") == before  # nothing new started, nothing ended

    # unchanged inputs: the retry resumes the sweep, and the completed trial is not run again
    corpus.write_bytes(original)
    cfg.write_text(json.dumps(HF_CONFIG))
    r = run_cli(args(out2), timeout_s=600)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    assert "resuming sweep retry-1" in text
    state = json.loads((out2 / "sweep.json").read_text())
    assert state["status"] == "SUCCEEDED" and state["inputs"] == pinned
    cbs = json.loads((out2 / "cbs.json").read_text())
    assert cbs["trials"]["COMPLETED"] == 2
    again = _reports(out2)
    assert completed not in again  # not started again: no config, no report, in the retry's log
    finals = [
        r
        for log in (_reports(out1), again)
        for tid, v in log.items()
        if tid == completed
        for r in v["rows"]
        if r.get("done")
    ]
    assert len(finals) == 1
    # batch size 4: its trial restored from its checkpoint, or (when Tune's last snapshot was taken before it
    # started) asked again by the restored searcher as a new trial; either way it ran to its end in the retry
    (fours,) = [t for t, v in again.items() if v["batch"] == 4]
    assert again[fours]["ended"] == {"failed": False} and again[fours]["rows"][-1]["tokens_seen"] == 8192
    c, parents, kids = children(uri, "retry")
    assert len(parents) == 1 and parents[0].data.tags["critbatch.status"] == "SUCCEEDED"
    assert sorted(k.data.tags["critbatch.trial_id"] for k in kids) == sorted([completed, fours])
    for k in kids:
        assert k.info.status == "FINISHED"
        assert sorted(m.step for m in c.get_metric_history(k.info.run_id, "val_loss")) == [2048, 4096, 6144, 8192]

    # and the resumed answer is the uninterrupted one: the same spec run once through, under another sweep id
    ref = tmp_path / "out-ref"
    r = run_cli(
        [
            "run",
            str(spec),
            "--output",
            str(ref),
            "--tracking-uri",
            uri,
            "--sweep-id",
            "retry-ref",
            "--no-progress",
            "--address",
            address,
        ],
        timeout_s=600,
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert results_only(cbs) == results_only(json.loads((ref / "cbs.json").read_text()))
