"""A failed trial's error on record: the line that says what went wrong (``schema.trial_error_line``) in
``OUT/reports/<trial id>.end.json`` and ``trials.json``'s ``error``, and the sweep's message naming a full
disk when its trials failed on one (``sweeps.run.finish.full_disk_note``). The sweep of
``test_disk_full.py`` shows them end to end; these are the rules, on synthetic files.
"""

from __future__ import annotations

import json

from sweeps.analysis import TrialRecord
from sweeps.run.finish import full_disk_note
from sweeps.store.records import records_from_reports
from sweeps.tracking.schema import names_full_disk, trial_error_line

#: the end of a Tune ``error.txt`` of a trial whose checkpoint write found the disk full in its trial runner
TUNE_ERROR = """Failure # 1 (occurred at 2026-12-07_02-25-37)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=26721, ip=192.0.2.2, repr=run_trial)
  File "/work/main/sweeps/launch/exchange.py", line 89, in relay
    raise TrialRunnerError(f"trial {trial_id} failed in its trial runner: {error}")
sweeps.launch.exchange.TrialRunnerError: trial 39eb3385 failed in its trial runner: Traceback (most recent call last):
  File "/work/main/workloads/train/state_file.py", line 45, in save_state
    torch.save(state, f)
RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 161472 vs 161360

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "/work/main/workloads/ray/runner.py", line 91, in save_checkpoint
workloads.errors.OutOfSpace: no space left on device while writing the checkpoint to /o/train/train-39eb3385/ckpt-000002/trial_state.pt (torch: unexpected pos 161472 vs 161360)

"""
LINE = (
    "workloads.errors.OutOfSpace: no space left on device while writing the checkpoint to "
    "/o/train/train-39eb3385/ckpt-000002/trial_state.pt (torch: unexpected pos 161472 vs 161360)"
)


def test_the_error_line_is_the_last_line_of_the_trials_error_without_colour_codes():
    assert trial_error_line(TUNE_ERROR) == LINE
    assert trial_error_line("\x1b[31mRuntimeError: injected fault at milestone 1\x1b[0m\n") == (
        "RuntimeError: injected fault at milestone 1"
    )
    assert trial_error_line("") is None and trial_error_line(None) is None and trial_error_line("\n \n") is None
    assert len(trial_error_line("x" * 5000)) == 1000


def test_a_full_disk_is_found_in_any_words_and_quoted_from_them():
    assert names_full_disk(LINE) == LINE[len("workloads.errors.OutOfSpace: ") :]
    assert names_full_disk("OSError: [Errno 28] No space left on device: '/o/x'") == "No space left on device: '/o/x'"
    assert names_full_disk("OSError: [Errno 122] Disk quota exceeded") == "Disk quota exceeded"
    assert names_full_disk("RuntimeError: unexpected pos 1 vs 0") is None and names_full_disk(None) is None


def _trial(reports, tid: str, batch: int, end: dict | None) -> None:
    (reports / f"{tid}.params.json").write_text(json.dumps({"batch_size_sequences": batch, "seed": 0}))
    if end is not None:
        (reports / f"{tid}.end.json").write_text(json.dumps(end))


def test_a_failed_trials_error_reaches_its_record_and_trials_json(tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    _trial(reports, "a", 4, {"failed": True, "error": LINE})
    _trial(reports, "b", 8, {"failed": True})  # a sweep from before the error was kept
    _trial(reports, "c", 16, {"failed": False, "error": "RuntimeError: an attempt that was retried"})
    records = {r.trial_id: r for r in records_from_reports(tmp_path)}
    assert records["a"].status == "FAILED" and records["a"].error == LINE
    assert records["b"].status == "FAILED" and records["b"].error is None
    assert records["c"].status != "FAILED" and records["c"].error is None  # its latest attempt did not fail
    row = json.loads(json.dumps(records["a"].to_dict()))  # as trials.json holds it
    assert row["error"] == LINE and TrialRecord.from_dict(row).error == LINE
    assert TrialRecord.from_dict({k: v for k, v in row.items() if k != "error"}).error is None  # an older trials.json


def _record(tid: str, status: str, error: str | None = None) -> TrialRecord:
    return TrialRecord(
        trial_id=tid, batch_size_sequences=4, seed=0, group_id=tid, status=status, hyperparameters={}, error=error
    )


def test_the_sweeps_message_says_how_many_failed_trials_found_their_disk_full():
    records = [
        _record("a", "FAILED", LINE),
        _record("b", "FAILED", "RuntimeError: boom"),
        _record("c", "FAILED", "OSError: [Errno 28] No space left on device: '/o/x'"),
        _record("d", "COMPLETED"),
        _record("e", "DIVERGED"),
    ]
    assert full_disk_note(records) == (
        "2 of the 3 failed trial(s) found their disk full (trial a: no space left on device while writing the "
        "checkpoint to /o/train/train-39eb3385/ckpt-000002/trial_state.pt (torch: unexpected pos 161472 vs 161360))"
    )
    assert full_disk_note([_record("b", "FAILED", "RuntimeError: boom"), _record("d", "COMPLETED")]) == ""
    assert full_disk_note([]) == ""
