"""A sweep's state on disk: ``OUT/sweep.json`` (:class:`SweepState`) and where the sweep keeps the rest
(the storage root for Tune and Train, the Tune experiment folder, the Optuna storage, the report log).

``OUT/`` holds ``sweep.json``, ``spec.yaml`` (the resolved spec), ``tune/<sweep id>/`` (Tune's
experiment, unless ``resources.storage_path`` moves it), ``reports/<trial id>.jsonl``,
``optuna.db``, ``trials.json``, ``cbs.json``, ``report.html`` and ``plots/``.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sweeps import files
from sweeps.errors import InvalidInput
from sweeps.settings import Settings
from sweeps.spec import SweepSpec
from sweeps.spec.statuses import SWEEP_STATUSES, SweepStatus  # sweep.json's status
from sweeps.store.migrations import SWEEP_JSON_VERSION, VERSION_KEY, read_sweep_json

__all__ = [
    "PRUNED_WHILE_PAUSED",
    "REPORTS_DIR",
    "SWEEP_STATUSES",
    "SweepState",
    "optuna_storage_url",
    "storage_root",
    "tune_dir_of",
    "tune_experiment_dir",
    "write_json",
]


#: ``OUT/reports/<trial id>.jsonl``: every report Tune received for a trial, across restarts (:class:`sweeps.store.reportlog.ReportLog`)
REPORTS_DIR = "reports"

#: trials pruned while paused at a rung (``pruning.mode: pause``): ``{trial id: the scheduler's annotation}``.
#: Their last Tune report is the rung they waited at, so result.json alone cannot say they were pruned.
PRUNED_WHILE_PAUSED = "pruned_while_paused.json"


@dataclass(kw_only=True)
class SweepState:
    """``OUT/sweep.json`` of a started sweep: its identity, where it logs and keeps state, and its status.

    The file is versioned (its ``schema_version``, :data:`sweeps.store.migrations.SWEEP_JSON_VERSION` when
    written here); :meth:`load` reads an older version through :mod:`sweeps.store.migrations`.

    Attributes:
        sweep_id: the sweep id (:mod:`sweeps.spec.identity`).
        fingerprint: the spec's fingerprint the id is bound to (None in sweeps older than the binding).
        tracking_uri, experiment_id, parent_run_id: the MLflow store, experiment and parent run.
        data_path: the resolved data path the trials read.
        ray_address: the ``--address`` given (None: ``RAY_ADDRESS`` or a local cluster).
        storage_root: where Tune and Train keep state (:func:`storage_root`).
        optuna_storage: the Optuna storage URL (:func:`optuna_storage_url`).
        status: one of :data:`SWEEP_STATUSES` but ``STARTING``.
        created: Unix time the sweep started (seconds).
        mlflow_complete: whether every MLflow write was delivered when the sweep ended (None: running).
        mlflow_incomplete_writes: the writes that were not (when ``mlflow_complete`` is False).
        inputs: the content hashes of the inputs that shape the result, pinned at the start
            (:func:`sweeps.store.inputs.pin_inputs`; None in a sweep started before they were pinned).
        error: why the driver itself crashed (status ``FAILED``; e.g. "no space left on device while
            writing OUT/trials.json"); None otherwise. A crashed sweep is resumable: ``critbatch resume``
            clears it.
        extra: keys of the file this version does not know, written back unchanged.
    """

    sweep_id: str
    fingerprint: str | None
    tracking_uri: str
    experiment_id: str
    parent_run_id: str
    data_path: str
    ray_address: str | None
    storage_root: str
    optuna_storage: str
    status: str = SweepStatus.RUNNING
    created: float = field(default_factory=time.time)
    mlflow_complete: bool | None = None
    mlflow_incomplete_writes: list[str] | None = None
    inputs: dict[str, dict[str, Any]] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``sweep.json``: ``schema_version`` first, then the fields (the ``mlflow_*``,
        ``inputs`` and ``error`` keys only once set)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        d = {VERSION_KEY: SWEEP_JSON_VERSION, **fields}
        for k in ("mlflow_complete", "mlflow_incomplete_writes", "inputs", "error"):
            if d[k] is None:
                del d[k]
        return {**d, **self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SweepState:
        """Parse a ``sweep.json`` object of the current version (unknown keys kept in ``extra``;
        ``schema_version`` dropped, :meth:`to_dict` writes it).

        Raises:
            KeyError: a required key is missing.
        """
        d = {k: v for k, v in d.items() if k != VERSION_KEY}
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        known.setdefault("fingerprint", None)
        known.setdefault("ray_address", None)
        return cls(**known, extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def load(cls, output: Path) -> SweepState:
        """The state of the sweep in ``output``, its ``sweep.json`` upgraded to the current version
        (:func:`sweeps.store.migrations.read_sweep_json`).

        Raises:
            InvalidInput: the sweep never started (its driver died while starting), the file is not a
                sweep's state, or its version is newer than this code's.
        """
        d = read_sweep_json(output / "sweep.json")
        if d.get("status") == SweepStatus.STARTING or "parent_run_id" not in d:
            raise InvalidInput(
                f"sweep '{d.get('sweep_id', '?')}' in {output} never started (its driver died while "
                f"starting): nothing to resume; `critbatch run SPEC --output {output}` starts it again"
            )
        d.setdefault("storage_root", str(output))  # sweeps from before shared storage roots
        d.setdefault("optuna_storage", optuna_storage_url(output))
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError) as exc:
            raise InvalidInput(f"{output}/sweep.json is not a sweep's state ({exc})") from None

    def save(self, output: Path) -> None:
        """Write ``OUT/sweep.json`` whole or not at all.

        Raises:
            WriteFailed: the write failed; the previous ``sweep.json`` is unchanged.
        """
        write_json(output / "sweep.json", self.to_dict())


def storage_root(spec: SweepSpec, output: Path, sweep_id: str, settings: Settings | None = None) -> str:
    """Where Tune and Train keep this sweep's state: ``resources.storage_path`` or
    ``CRITBATCH_STORAGE_PATH`` (``settings.storage_path``; plus ``/<sweep id>``), else the output folder."""
    base = spec.resources.storage_path or (settings or Settings.from_env()).storage_path
    if not base:
        return str(output)
    return base.rstrip("/") + "/" + sweep_id


def tune_experiment_dir(root: str, sweep_id: str) -> str:
    """The sweep's Tune experiment folder: ``ROOT/tune/<sweep id>`` (the Tune run is named by the sweep id).

    Ray stages an experiment's files on the driver node under ``<session>/artifacts/<start
    second>/<run name>/`` and syncs that whole folder to the run's storage: two sweeps on one
    cluster that started in the same second under one run name would share it, and each would
    read (and resume) the other's trials.
    """
    return f"{root}/tune/{sweep_id}"


def tune_dir_of(root: str, sweep_id: str) -> str:
    """:func:`tune_experiment_dir`, or ``ROOT/tune`` for a sweep started before runs were named by sweep id."""
    legacy = f"{root}/tune"
    if not Path(tune_experiment_dir(root, sweep_id)).exists() and Path(legacy, "tuner.pkl").is_file():
        return legacy
    return tune_experiment_dir(root, sweep_id)


def optuna_storage_url(output: Path, settings: Settings | None = None) -> str:
    """``CRITBATCH_OPTUNA_STORAGE`` (``settings.optuna_storage``: an RDB URL that outlives the cluster), else
    ``sqlite:///OUT/optuna.db``."""
    return (settings or Settings.from_env()).optuna_storage or f"sqlite:///{output / 'optuna.db'}"


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` whole or not at all (:func:`sweeps.files.write_json`).

    Raises:
        WriteFailed: the write failed; the previous file is unchanged.
    """
    files.write_json(path, data, default=_json_default)


def _json_default(o: Any) -> Any:
    if isinstance(o, float):
        return None
    if isinstance(o, (set, tuple)):
        return list(o)
    if hasattr(o, "item"):
        return o.item()
    return str(o)
