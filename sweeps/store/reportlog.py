"""``OUT/reports/``: the driver's own log of every trial, beside Tune's (:class:`ReportLog`).

Per trial ``<trial id>.params.json`` (its config, from its start), ``<trial id>.jsonl`` (every report
Tune received, across restarts, never rewritten) and ``<trial id>.end.json`` (how its latest attempt
ended: ``{"failed": bool}``, with ``"error"``, the line of its error that says what went wrong, when it
failed; ``false`` again when a trial that ended starts again). :func:`sweeps.store.records.collect_records`
reads them. Every write goes through :mod:`sweeps.files`: a full disk leaves each file as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

from ray.tune import Callback

from sweeps import files
from sweeps.errors import WriteFailed
from sweeps.tracking.schema import TRIAL_END_SUFFIX, TRIAL_PARAMS_SUFFIX, trial_error_line

__all__ = ["ReportLog"]


class ReportLog(Callback):
    """A Tune callback that keeps, per trial, its config, every report and how it ended, in ``FOLDER``.

    Tune rewrites a restored trial's ``result.json`` from its own copy (seen with Ray 2.60 and a local
    storage path: the rows before the restart were gone, so ``trials.json`` showed a curve that
    started at the restart); :func:`sweeps.store.records.collect_records` reads these files with it.

    Attributes:
        write_error: the first write that failed (None if none did); the callback raises it too, which
            ends Tune's run (Tune wraps it in a ``TuneError`` that keeps only its text).
    """

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.write_error: WriteFailed | None = None

    def __getstate__(self):  # Tune pickles its run config
        return {"folder": self.folder, "write_error": None}

    def _guard(self, write) -> None:
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write()
        except OSError as exc:  # mkdir
            self.write_error = self.write_error or files.write_failed(self.folder, exc)
            raise self.write_error from exc
        except WriteFailed as exc:
            self.write_error = self.write_error or exc
            raise

    def on_trial_start(self, iteration, trials, trial, **info):
        # Tune writes the trial's params.json only with its first result: a trial that fails before it
        # (Tune aborting a reused actor, a worker that dies while starting) would be in no record
        params = self.folder / f"{trial.trial_id}{TRIAL_PARAMS_SUFFIX}"
        if not params.is_file():
            self._guard(lambda: files.write_json(params, trial.config, indent=None, default=str))
        if (self.folder / f"{trial.trial_id}{TRIAL_END_SUFFIX}").is_file():  # it ended before and runs again
            self._end(trial, failed=False)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        row = {k: v for k, v in result.items() if k != "config"}
        self._guard(lambda: files.append_line(self.folder / f"{trial.trial_id}.jsonl", json.dumps(row, default=str)))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self._end(trial, failed=False)

    def on_trial_error(self, iteration, trials, trial, **info):
        self._end(trial, failed=True, error=trial_error_line(files.read_tail(trial.error_file, 2000)))

    def _end(self, trial, *, failed: bool, error: str | None = None) -> None:
        end = {"failed": failed, **({"error": error} if error else {})}
        self._guard(lambda: files.write_json(self.folder / f"{trial.trial_id}{TRIAL_END_SUFFIX}", end))
