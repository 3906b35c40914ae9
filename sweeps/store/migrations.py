"""Reading a sweep's state written by an older critbatch: ``OUT/sweep.json`` by version, Tune's pickles by
class path.

``sweep.json`` carries ``schema_version`` (:data:`SWEEP_JSON_VERSION`; a file without it is version 1).
Every read goes through :func:`read_sweep_json`, which upgrades the object one version at a time through
:data:`SWEEP_JSON_STEPS` (step ``N`` turns version ``N`` into ``N + 1``), as Optuna's RDB storage upgrades
its schema through an ordered chain of Alembic revisions, and refuses a version newer than this code's.

Tune's experiment folder (``tuner.pkl``, the searcher's ``searcher-state-*.pkl``) pickles classes and
functions by module path. :data:`PICKLE_RENAMES` maps the paths an older critbatch wrote to the current
ones; :func:`load_old_pickle` reads through it, and :func:`migrate_tune_state` rewrites the folder's
pickles with the current paths before ``Tuner.restore`` reads them, keeping each original beside it as
``NAME.pre-migration``.

Where it stands: imports ``sweeps.errors`` and ``sweeps.files``; ``sweeps.store.state`` reads through it.
Ray, ``cloudpickle`` and the searcher are imported only by :func:`migrate_tune_state`.
"""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput
from sweeps.files import write_atomic

__all__ = [
    "BACKUP_SUFFIX",
    "PICKLE_RENAMES",
    "SWEEP_JSON_STEPS",
    "SWEEP_JSON_VERSION",
    "VERSION_KEY",
    "MigratingUnpickler",
    "load_old_pickle",
    "migrate_tune_state",
    "read_sweep_json",
    "tune_state_files",
    "upgrade_sweep_json",
]

# ---- sweep.json ---------------------------------------------------------------------------------------

#: the key of ``sweep.json`` that holds its schema version (absent: version 1)
VERSION_KEY = "schema_version"


def _v1_to_v2(d: dict[str, Any]) -> dict[str, Any]:
    """Version 2 is version 1 with :data:`VERSION_KEY`: every key of a version-1 file keeps its meaning."""
    return dict(d)


#: ``SWEEP_JSON_STEPS[N - 1]`` upgrades a version-``N`` object to version ``N + 1``; append a step (and
#: a test that an old file reads as the new one) with each change of the format
SWEEP_JSON_STEPS: list[Callable[[dict[str, Any]], dict[str, Any]]] = [_v1_to_v2]

#: the version this code writes and reads without upgrading
SWEEP_JSON_VERSION = len(SWEEP_JSON_STEPS) + 1


def upgrade_sweep_json(d: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``d`` (the object of the ``sweep.json`` at ``path``) at :data:`SWEEP_JSON_VERSION`, with
    :data:`VERSION_KEY` set.

    Raises:
        InvalidInput: the version is newer than :data:`SWEEP_JSON_VERSION` or not a positive integer
            (one line naming ``path`` and both versions; exit code 2 from the CLI).
    """
    version = d.get(VERSION_KEY, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise InvalidInput(
            f"{path}: schema version {version!r} is not a version this critbatch knows "
            f"(it reads versions 1 to {SWEEP_JSON_VERSION})"
        )
    if version > SWEEP_JSON_VERSION:
        raise InvalidInput(
            f"{path} has schema version {version}, newer than the {SWEEP_JSON_VERSION} this critbatch "
            "reads: use the critbatch that wrote it, or a newer one"
        )
    for step in SWEEP_JSON_STEPS[version - 1 :]:
        d = step(d)
    return {**d, VERSION_KEY: SWEEP_JSON_VERSION}


def read_sweep_json(path: str | Path) -> dict[str, Any]:
    """The object of the ``sweep.json`` at ``path``, upgraded to :data:`SWEEP_JSON_VERSION`
    (:func:`upgrade_sweep_json`).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not JSON (``json.JSONDecodeError``) or not a JSON object.
        InvalidInput: its version is newer than this code's (:func:`upgrade_sweep_json`).
    """
    d = json.loads(Path(path).read_text())
    if not isinstance(d, dict):
        raise ValueError(f"{path} is not a JSON object")  # noqa: TRY004 - read as unreadable JSON is
    return upgrade_sweep_json(d, path)


# ---- Tune's pickles -----------------------------------------------------------------------------------

#: module paths that the trial's and the driver's pickles named before the ``workloads`` subpackages
_WORKLOADS_MODULES = {
    **{
        f"workloads.{m}": f"workloads.train.{m}"
        for m in (
            "loop",
            "step",
            "sync",
            "evaluation",
            "schedule",
            "ema",
            "noise_scale",
            "batching",
            "scaling",
            "optim",
            "parallel",
            "determinism",
        )
    },
    "workloads.shards": "workloads.data.shards",
    "workloads.prepare": "workloads.data.prepare",
    "workloads._prepare_io": "workloads.data._prepare_io",
    "workloads.tokenizer": "workloads.data.tokenizer",
    "workloads.flops": "workloads.model.flops",
    "workloads._ray_adapter": "workloads.ray.adapter",
    "workloads._ray_compat": "workloads.ray.compat",
    "workloads._ray_runner": "workloads.ray.runner",
}

#: names of the flat modules ``workloads/data.py`` and ``workloads/model.py``, now in a module of the package
_FLAT_MODULE_NAMES = {
    ("workloads.data", "workloads.data.corpus"): (
        "Corpus",
        "load_corpus",
        "load_shard_corpus",
        "tokenizer_vocab_size",
        "encode_text",
        "step_generator",
        "window_batch",
        "validation_batches",
    ),
    ("workloads.model", "workloads.model.hf"): (
        "hf_config",
        "build_model",
        "shape_of",
        "model_flops_per_token",
        "check_model_config",
        "model_vocab_size",
        "peak_flops_per_s",
        "DEVICE_PEAK_BF16_FLOPS",
    ),
}

#: classes that left ``sweeps.spec.sections`` and ``sweeps.tracking.writer`` for modules of their own
_MOVED_CLASSES = {
    ("sweeps.spec.sections", "TrackingSpec"): "sweeps.spec.tracking",
    ("sweeps.spec.sections", "FinetuneSpec"): "sweeps.spec.finetune",
    ("sweeps.spec.sections", "LoraSpec"): "sweeps.spec.finetune",
    ("sweeps.spec.sections", "SearchSpec"): "sweeps.spec.search",
    ("sweeps.spec.sections", "Beta2Spec"): "sweeps.spec.search",
    ("sweeps.spec.sections", "InitialPointSpec"): "sweeps.spec.search",
    ("sweeps.tracking.writer", "Outbox"): "sweeps.tracking.outbox",
}

#: the one table of old pickle paths: ``"module"`` (every name in it) or ``"module:name"`` -> the same form now
#: the modules of sweeps/run that moved to sweeps/launch and sweeps/store (Tune pickles the reaper, the report log,
#: the records' builder and the runners' cancel list by these paths)
_LAUNCH_MODULES = ("trainable", "runners", "exchange", "reaper", "cluster", "reach", "workload")
_STORE_MODULES = ("state", "records", "reportlog", "claims", "inputs", "migrations")

PICKLE_RENAMES: dict[str, str] = {
    **_WORKLOADS_MODULES,
    **{f"{old}:{n}": f"{new}:{n}" for (old, new), names in _FLAT_MODULE_NAMES.items() for n in names},
    **{f"{old}:{n}": f"{new}:{n}" for (old, n), new in _MOVED_CLASSES.items()},
    # the MLflow sink was the only tracker, named Tracker, before the Tracker base class existed
    "sweeps.tracking.writer:Tracker": "sweeps.tracking.writer:MlflowTracker",
    # sweeps/run split by concern: launching trials and the sweep's store left the orchestration
    **{f"sweeps.run.{m}": f"sweeps.launch.{m}" for m in _LAUNCH_MODULES},
    **{f"sweeps.run.{m}": f"sweeps.store.{m}" for m in _STORE_MODULES},
}

#: cloudpickle's reference to a module a function by value uses (``subimport(name)``): its argument is a path too
_SUBIMPORT = {("ray.cloudpickle.cloudpickle", "subimport"), ("cloudpickle.cloudpickle", "subimport")}


def _renamed(module: str, name: str) -> tuple[str, str] | None:
    """Where ``module.name`` of an old pickle lives now (:data:`PICKLE_RENAMES`); None: where it was."""
    new = PICKLE_RENAMES.get(f"{module}:{name}") or PICKLE_RENAMES.get(module)
    if new is None:
        return None
    new_module, _, new_name = new.partition(":")
    return new_module, new_name or name


class MigratingUnpickler(pickle.Unpickler):
    """An unpickler that loads the paths of :data:`PICKLE_RENAMES` from where they live now.

    Attributes:
        renamed: the ``(module, name)`` pairs it found under an old path, in the order it met them.
    """

    def __init__(self, file: Any):
        super().__init__(file)
        self.renamed: list[tuple[str, str]] = []

    def find_class(self, module: str, name: str) -> Any:
        new = _renamed(module, name)
        if new is not None:
            self.renamed.append((module, name))
            module, name = new
        found = super().find_class(module, name)
        if (module, name) in _SUBIMPORT:
            return self._subimport(found)
        return found

    def _subimport(self, subimport: Callable[[str], Any]) -> Callable[[str], Any]:
        def renamed_subimport(path: str) -> Any:
            if path in PICKLE_RENAMES:
                self.renamed.append((path, ""))
                path = PICKLE_RENAMES[path]
            return subimport(path)

        return renamed_subimport


def load_old_pickle(data: bytes) -> tuple[Any, list[tuple[str, str]]]:
    """Unpickle ``data`` through :class:`MigratingUnpickler`.

    Returns:
        ``(object, renamed)``: the object, with the current classes, and the old paths it named.

    Raises:
        whatever ``pickle.Unpickler.load`` raises (``pickle.UnpicklingError``, ``AttributeError``,
        ``ModuleNotFoundError``, ``EOFError``, ...) for a path neither here nor in the table, or a cut file.
    """
    unpickler = MigratingUnpickler(io.BytesIO(data))
    obj = unpickler.load()
    return obj, unpickler.renamed


#: suffix of the original of a rewritten pickle, beside it (not ``.pkl``: Tune does not read it back)
BACKUP_SUFFIX = ".pre-migration"


def tune_state_files(tune_dir: str | Path) -> list[Path]:
    """The pickles of a Tune experiment folder that name critbatch's classes: ``tuner.pkl`` and the
    searcher's ``searcher-state-*.pkl``, those that exist."""
    tune_dir = Path(tune_dir)
    return [p for p in [tune_dir / "tuner.pkl", *sorted(tune_dir.glob("searcher-state-*.pkl"))] if p.is_file()]


def _upgraded_searcher(tuner_state: Any) -> bool:
    """Give the searcher pickled in ``tuner.pkl``'s Tune config the attributes added since it was pickled
    (its ``set_state`` fills each missing one with its default); whether it lacked any."""
    from sweeps._compat import searcher_inside

    try:
        searcher = searcher_inside(tuner_state["_tune_config"].search_alg)
    except (KeyError, AttributeError, TypeError, RuntimeError):
        return False  # not a critbatch searcher, or not a Tuner's state
    from sweeps.search.searcher import OLD_LAYOUT_ATTR

    old_layout = bool(vars(searcher).pop(OLD_LAYOUT_ATTR, False))
    before = set(vars(searcher))
    searcher.set_state(dict(vars(searcher)))
    return old_layout or set(vars(searcher)) != before


def migrate_tune_state(tune_dir: str | Path) -> list[Path]:
    """Rewrite the pickles of the Tune experiment folder ``tune_dir`` that an older critbatch wrote
    (:func:`tune_state_files`) with the current class paths, so that ``Tuner.restore`` reads them without
    :data:`PICKLE_RENAMES`; ``tuner.pkl``'s searcher also gets the attributes added since.

    All of them are read first: if one does not load, none is changed. Each rewritten file keeps its
    original beside it (``NAME.pre-migration``, not replaced by a later migration) and is written whole or
    not at all (:func:`sweeps.files.write_atomic`). A folder that is not local (a URI) is left alone.

    Returns:
        the files rewritten (none when every pickle already names the current paths).

    Raises:
        what :func:`load_old_pickle` raises (nothing changed), or ``WriteFailed``.
    """
    from ray.cloudpickle.cloudpickle import dumps  # what Tune writes tuner.pkl with

    rewrites = []
    for path in tune_state_files(tune_dir) if Path(tune_dir).is_dir() else []:
        obj, renamed = load_old_pickle(path.read_bytes())
        upgraded = path.name == "tuner.pkl" and _upgraded_searcher(obj)
        if renamed or upgraded:
            rewrites.append((path, dumps(obj)))
    for path, data in rewrites:
        backup = path.with_name(path.name + BACKUP_SUFFIX)
        if not backup.exists():
            write_atomic(backup, path.read_bytes())
        write_atomic(path, data)
    return [path for path, _ in rewrites]
