"""Staging a sweep for Ray Jobs: the job's working directory, its entrypoint and its arguments.

A submitted sweep's spec travels as a file (``spec.yaml``) in the job's working directory, never
inside the command (:mod:`sweeps.remote.entrypoint`). The working directory is a fresh folder holding
only the packages (``sweeps``, ``workloads``, ``service`` and ``critbatch``, the program the entrypoint
runs), ``pyproject.toml``, ``spec.yaml`` and, when small, the data (the spec's paths are rewritten to the
shipped copies). Its size is checked before upload (:class:`StagingLimits`).

Imports neither torch, Ray nor MLflow: the REST service uses it.
"""

from __future__ import annotations

import contextlib
import fnmatch
import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sweeps.errors import CritbatchError, InvalidInput
from sweeps.files import write_atomic
from sweeps.remote.entrypoint import SPEC_FILE, build_entrypoint
from sweeps.remote.errors import StagingError
from sweeps.spec import SpecError, SweepSpec, parse_spec
from sweeps.spec.identity import check_sweep_id, default_sweep_id, job_tracking_uri, redact_uri
from sweeps.tracking.reader import readable_here
from sweeps.tracking.schema import (
    META_EXPERIMENT,
    META_FINGERPRINT,
    META_NAME,
    META_SWEEP_ID,
    META_TRACKING_URI,
    META_TRIALS_PLANNED,
)

__all__ = [
    "INPUTS_DIR",
    "PACKAGES",
    "StagedSweep",
    "StagingLimits",
    "shippable_files",
    "stage_sweep",
    "staged_summary",
    "staged_sweep",
]

MiB = 1024 * 1024

#: The packages a job needs, the entrypoint's program (``python -m critbatch``) last; copied from wherever
#: they are imported from (found, never imported: the CLI sits above this package).
PACKAGES = ("sweeps", "workloads", "service", "critbatch")
#: Shipped inputs go under this folder of the job's working directory.
INPUTS_DIR = "inputs"
_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".*", "*.egg-info", "node_modules")
#: Never shipped from an input folder: caches and build leftovers (and every name starting with '.').
_NOT_SHIPPED = ("__pycache__", "node_modules", "*.pyc", "*.pyo", "*.egg-info")
#: Left out of the upload by Ray too (belt and braces: the staging folder holds none of these).
_RUNTIME_EXCLUDES = [".git", ".venv", "venv", "__pycache__", "*.pyc", "outputs", "mlruns", "mlflow.db"]


# ---- what is staged ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class StagingLimits:
    """Size limits of what a submission uploads.

    Attributes:
        ship_data_max_bytes: a data file or folder (corpus, tokenizer, checkpoint) at most this big
            is shipped with the job; a bigger one must be readable from the cluster.
        upload_max_bytes: the whole working directory (code + spec + shipped data).
    """

    ship_data_max_bytes: int = 20 * MiB
    upload_max_bytes: int = 100 * MiB

    @classmethod
    def from_mb(cls, *, ship_data_max_mb: float | None = None, upload_max_mb: float | None = None) -> StagingLimits:
        """The limits in MiB (None keeps a default)."""
        d = cls()
        return cls(
            ship_data_max_bytes=int(ship_data_max_mb * MiB) if ship_data_max_mb is not None else d.ship_data_max_bytes,
            upload_max_bytes=int(upload_max_mb * MiB) if upload_max_mb is not None else d.upload_max_bytes,
        )


@dataclass(frozen=True, kw_only=True)
class StagedSweep:
    """A sweep ready to submit: its working directory and the exact job arguments.

    Attributes:
        sweep_id: the Ray submission id.
        spec: the spec as the job runs it (shipped paths rewritten).
        fingerprint: the fingerprint of the spec as given (before rewriting).
        tracking_uri: the MLflow tracking URI the job logs to.
        working_dir: the staging folder (the job's ``working_dir``).
        entrypoint, runtime_env, metadata: the arguments of ``JobSubmissionClient.submit_job``.
        size_bytes: bytes under ``working_dir``.
        shipped: ``(spec field, original path)`` of every shipped input.
        warnings: things the submitter should know (printed by the CLI, returned by the service).
    """

    sweep_id: str
    spec: SweepSpec
    fingerprint: str
    tracking_uri: str
    working_dir: Path
    entrypoint: str
    runtime_env: dict[str, Any]
    metadata: dict[str, str]
    size_bytes: int
    shipped: tuple[tuple[str, str], ...] = ()
    warnings: tuple[str, ...] = ()


def _tree_size(p: Path, stop_above: int | None = None) -> int:
    """Bytes in a file or folder (symbolic links inside a folder not followed); stops counting
    once past ``stop_above``."""
    if p.is_file():
        return p.stat().st_size
    total = 0
    for root, _dirs, files in os.walk(p):
        for f in files:
            try:
                total += (Path(root) / f).lstat().st_size
            except OSError:
                pass
        if stop_above is not None and total > stop_above:
            break
    return total


def _shipped(name: str) -> bool:
    return not name.startswith(".") and not any(fnmatch.fnmatch(name, pat) for pat in _NOT_SHIPPED)


def shippable_files(folder: Path) -> list[tuple[Path, Path]]:
    """``(source, path relative to folder)`` of every file an input folder ships.

    Left out: dotfiles and dot-folders (``.git``, ``.venv``, ``.env``), caches (``__pycache__``,
    ``node_modules``, ``*.pyc``, ``*.egg-info``), links to folders, and links to files outside
    ``folder`` (a link to a file inside it is shipped as that file). A Hugging Face cache snapshot
    (links into ``../../blobs``) therefore ships nothing: ``save_pretrained`` it to a folder first.
    """
    root = folder.resolve()
    out: list[tuple[Path, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        keep = []
        for d in sorted(dirnames):
            p = here / d
            if _shipped(d) and not p.is_symlink():  # a linked folder is left out (inside: shipped as itself)
                keep.append(d)
        dirnames[:] = keep
        for f in sorted(filenames):
            p = here / f
            if not _shipped(f):
                continue
            try:
                target = p.resolve(strict=True)
            except (OSError, RuntimeError):
                continue  # a dangling link
            if not target.is_relative_to(root) or not target.is_file():
                continue
            out.append((target, p.relative_to(root)))
    return out


def _mb(n: int) -> str:
    return f"{n / MiB:.1f} MB"


def _package_dir(name: str) -> Path:
    found = importlib.util.find_spec(name)
    if found is None or not found.submodule_search_locations:
        raise CritbatchError(f"package {name!r} not found: cannot stage the job's code")
    return Path(next(iter(found.submodule_search_locations)))


def _is_uri(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def _inputs_of(spec: SweepSpec) -> list[tuple[str, str, str]]:
    """``(spec field, path, staged name)`` of every local input a job may need shipped."""
    out: list[tuple[str, str, str]] = []  # data.path or data.shards: the spec holds exactly one
    if spec.data.shards is not None:  # a prepared folder ships whole (within the limit); a URI stays
        out.append(("data.shards", spec.data.shards, f"{INPUTS_DIR}/shards"))
    elif spec.data.path is not None:
        out.append(("data.path", spec.data.path, f"{INPUTS_DIR}/data/{Path(spec.data.path).name or 'data'}"))
    if spec.data.tokenizer != "byte":
        out.append(("data.tokenizer", spec.data.tokenizer, f"{INPUTS_DIR}/tokenizer"))
    if spec.finetune is not None:
        out.append(("finetune.checkpoint_dir", spec.finetune.checkpoint_dir, f"{INPUTS_DIR}/checkpoint"))
    if isinstance(spec.model.hf_config, str):  # a config.json (a folder ships whole)
        out.append(("model.hf_config", spec.model.hf_config, f"{INPUTS_DIR}/model/{Path(spec.model.hf_config).name}"))
    return out


def _set_field(d: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for k in parents:
        d = d[k]
    d[leaf] = value


# ---- building the working directory --------------------------------------------------------------


def _ship_input(
    fld: str,
    path: str,
    dest: Path,
    *,
    base: Path,
    root: Path | None,
    ship_data: bool,
    limits: StagingLimits,
    warnings: list[str],
) -> bool:
    """Copy one input to ``dest`` if it is local, ours to ship and small enough; True if copied.

    Raises:
        StagingError: a hidden or cache path, or an input over ``limits.ship_data_max_bytes``.
    """
    if _is_uri(path):
        return False
    local = Path(path) if Path(path).is_absolute() else base / path
    try:
        local = local.resolve()
    except (OSError, RuntimeError):
        return False
    if root is not None and not local.is_relative_to(root):
        return False  # not ours to ship: a path on the cluster
    if not local.exists():
        if not Path(path).is_absolute():
            warnings.append(
                f"{fld} {path!r} does not exist here; the job will look for it relative to its working directory on the cluster"
            )
        return False
    if not ship_data:
        if not Path(path).is_absolute():
            warnings.append(f"{fld} {path!r} is relative and not shipped: the job resolves it on the cluster")
        return False
    if any(not _shipped(part) for part in Path(path).parts if part not in (".", "/")):
        raise StagingError(
            fld,
            f"{fld} {path!r}: hidden files and folders (names starting with '.') and caches "
            "are never shipped with a job",
        )
    files = shippable_files(local) if local.is_dir() else [(local, Path(local.name))]
    size = sum(src.stat().st_size for src, _ in files)
    if size > limits.ship_data_max_bytes:
        raise StagingError(
            fld,
            f"{fld} {path!r} holds {_mb(size)} to ship, over the {_mb(limits.ship_data_max_bytes)} limit for data shipped "
            "with a job: put it where the cluster can read it (a shared filesystem or the image), set "
            f"{fld} to that path, and submit with --no-ship-data (or raise --ship-data-max-mb)",
        )
    if local.is_dir():
        dest.mkdir(parents=True)
        for src, rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local, dest)
    return True


def _submittable_id(spec: SweepSpec, sweep_id: str | None, into: Path) -> str:
    """The checks of :func:`stage_sweep` before anything is written; returns the sweep id to submit under
    (``sweep_id``, or :func:`sweeps.spec.identity.default_sweep_id`).

    Raises:
        InvalidInput: a comparison spec, folded milestones, a bad sweep id.
        CritbatchError: ``into`` is not empty.
    """
    if spec.arms:  # the job runs one sweep; each arm may name inputs of its own that would not be shipped
        raise InvalidInput(
            "a comparison (arms) is not submitted as one job: submit each arm as its own sweep, or run "
            "it with `critbatch run --address` against the cluster"
        )
    from sweeps.spec.milestones import check_milestones

    check_milestones(spec)  # refused here, not minutes later in the job (the service answers 422)
    sweep_id = check_sweep_id(sweep_id or default_sweep_id(spec))
    if any(into.iterdir()):
        raise CritbatchError(f"staging folder {into} is not empty")
    return sweep_id


def _ship_inputs(
    spec: SweepSpec,
    into: Path,
    *,
    base: Path,
    root: Path | None,
    ship_data: bool,
    limits: StagingLimits,
    warnings: list[str],
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Ship the spec's small local inputs into ``into`` (:func:`_ship_input`, which appends to ``warnings``).

    Returns:
        the spec's data (``model_dump``) with each shipped input's path rewritten to its copy, and
        ``(field, original path)`` of each shipped input.

    Raises:
        StagingError: a hidden or cache path, an input too big to ship, or a ``model.hf_config`` that does not parse.
    """
    data = spec.model_dump(mode="json")
    shipped: list[tuple[str, str]] = []
    for fld, path, staged_name in _inputs_of(spec):
        if _ship_input(
            fld, path, into / staged_name, base=base, root=root, ship_data=ship_data, limits=limits, warnings=warnings
        ):
            if (
                fld == "model.hf_config"
            ):  # read as the job will (no torch): refused now (422), not in the job 30 s later
                from sweeps.spec.hf_config import read_hf_config

                try:
                    read_hf_config(str(into / staged_name), shown_as=path)
                except InvalidInput as exc:
                    raise StagingError(fld, str(exc)) from None
            _set_field(data, fld, staged_name)
            shipped.append((fld, path))
    return data, shipped


def _write_spec(into: Path, data: dict[str, Any]) -> SweepSpec:
    """Write ``spec.yaml`` (the spec with shipped paths rewritten) and return it parsed."""
    try:
        staged_spec = parse_spec(data)
    except SpecError as exc:  # a rewritten path cannot make a valid spec invalid; guard anyway
        raise CritbatchError(f"staging changed the spec into an invalid one: {exc}") from None
    write_atomic(into / SPEC_FILE, yaml.safe_dump(data, sort_keys=False))
    return staged_spec


def _copy_code(into: Path) -> None:
    """The packages as imported here, and ``pyproject.toml`` when they come from a source tree."""
    pkg_dirs = [_package_dir(p) for p in PACKAGES]
    for name, src in zip(PACKAGES, pkg_dirs):
        shutil.copytree(src, into / name, ignore=_COPY_IGNORE)
    pyproject = pkg_dirs[0].parent / "pyproject.toml"
    if pyproject.is_file():
        shutil.copy2(pyproject, into / "pyproject.toml")


def _checked_size(into: Path, limits: StagingLimits) -> int:
    """Bytes under ``into``; :class:`StagingError` over ``limits.upload_max_bytes`` (naming the largest parts)."""
    size = _tree_size(into)
    if size > limits.upload_max_bytes:
        biggest = sorted(((_tree_size(p), p.name) for p in into.iterdir()), reverse=True)[:3]
        parts = ", ".join(f"{n} {_mb(s)}" for s, n in biggest)
        raise StagingError(
            "<root>",
            f"the job's working directory is {_mb(size)}, over the {_mb(limits.upload_max_bytes)} upload limit "
            f"(largest: {parts}); reference big inputs by a path the cluster can read (--no-ship-data)",
        )
    return size


def _job_metadata(spec: SweepSpec, sweep_id: str, tracking_uri: str) -> dict[str, str]:
    return {
        META_SWEEP_ID: sweep_id,
        META_NAME: spec.name,
        META_FINGERPRINT: spec.fingerprint(),
        META_EXPERIMENT: spec.experiment_name,
        META_TRACKING_URI: tracking_uri,
        META_TRIALS_PLANNED: str(spec.n_trials),
    }


def _runtime_env(into: Path, tracking_uri: str, storage_root: str | None) -> dict[str, Any]:
    env_vars = {"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1"}
    if storage_root:
        env_vars["CRITBATCH_STORAGE_PATH"] = storage_root
    return {"working_dir": str(into), "excludes": list(_RUNTIME_EXCLUDES), "env_vars": env_vars}


def stage_sweep(
    spec: SweepSpec,
    into: Path,
    *,
    sweep_id: str | None = None,
    tracking_uri: str | None = None,
    default_tracking_uri: str | None = None,
    base_dir: Path | str = ".",
    data_root: Path | str | None = None,
    ship_data: bool = True,
    limits: StagingLimits = StagingLimits(),
    python: str = "python",
    output_root: str = "outputs",
    storage_root: str | None = None,
) -> StagedSweep:
    """Build the job's working directory in the empty folder ``into`` and the job's arguments.

    Args:
        spec: the validated spec.
        into: an empty folder (the caller owns and removes it; see :func:`staged_sweep`).
        sweep_id: the submission id; default :func:`sweeps.spec.identity.default_sweep_id`.
        tracking_uri: where the job logs (``--tracking-uri``): wins over everything.
        default_tracking_uri: the environment's MLflow server (``MLFLOW_TRACKING_URI``): used
            unless the spec names a server itself; see :func:`sweeps.spec.identity.job_tracking_uri`.
        base_dir: relative input paths resolve from here (the submitter's working directory).
        data_root: if given, only inputs inside this folder are shipped (relative paths resolve
            from it); any other path is passed on as a path on the cluster. The service sets it.
        ship_data: False sends every input path as it is (it must be readable on the cluster).
        limits: size limits.
        python: the cluster-side interpreter (:func:`default_job_python`).
        output_root: the job's output folder is ``output_root/sweep_id``, relative to the job's
            working directory unless absolute.
        storage_root: the job keeps its Tune and Train state under ``storage_root/sweep_id``
            (``CRITBATCH_STORAGE_PATH`` in the job's environment) unless the spec names a
            ``resources.storage_path``; the service sets its ``CRITBATCH_STORAGE_ROOT``.

    Raises:
        InvalidInput: a comparison spec (``arms``), a spec whose milestones a batch size folds
            (:func:`sweeps.spec.milestones.check_milestones`), a bad sweep id, an input too big to ship or not parsing, or a
            working directory over ``limits.upload_max_bytes`` (the last three as :class:`StagingError`).
        CritbatchError: ``into`` is not empty.
    """
    into = Path(into)
    sweep_id = _submittable_id(spec, sweep_id, into)
    root = Path(data_root).resolve() if data_root is not None else None
    base = root if root is not None else Path(base_dir).resolve()
    tracking_uri = job_tracking_uri(spec, tracking_uri, default_tracking_uri)
    warnings: list[str] = []
    data, shipped = _ship_inputs(
        spec, into, base=base, root=root, ship_data=ship_data, limits=limits, warnings=warnings
    )
    staged_spec = _write_spec(into, data)
    _copy_code(into)
    size = _checked_size(into, limits)
    if not readable_here(tracking_uri)[0]:
        warnings.append(
            f"tracking URI {redact_uri(tracking_uri)!r} is a file on the cluster node: status and reports cannot "
            "read it from here; use an MLflow server (--tracking-uri or MLFLOW_TRACKING_URI)"
        )
    return StagedSweep(
        sweep_id=sweep_id,
        spec=staged_spec,
        fingerprint=spec.fingerprint(),
        tracking_uri=tracking_uri,
        working_dir=into,
        entrypoint=build_entrypoint(
            sweep_id=sweep_id, python=python, tracking_uri=tracking_uri, output_root=output_root
        ),
        runtime_env=_runtime_env(into, tracking_uri, storage_root),
        metadata=_job_metadata(spec, sweep_id, tracking_uri),
        size_bytes=size,
        shipped=tuple(shipped),
        warnings=tuple(warnings),
    )


@contextlib.contextmanager
def staged_sweep(spec: SweepSpec, **kwargs: Any) -> Iterator[StagedSweep]:
    """:func:`stage_sweep` into a temporary folder that is removed afterwards (same arguments and errors)."""
    with tempfile.TemporaryDirectory(prefix="critbatch-job-") as tmp:
        yield stage_sweep(spec, Path(tmp), **kwargs)


def staged_summary(staged: StagedSweep) -> dict[str, Any]:
    """A JSON-able summary of a staged submission (for ``--dry-run`` and logs): ``sweep_id``,
    ``entrypoint``, ``size_bytes``, ``shipped`` (spec fields), ``files`` (relative paths),
    ``metadata`` (the tracking URI redacted) and ``warnings``."""
    return {
        "sweep_id": staged.sweep_id,
        "entrypoint": staged.entrypoint,
        "size_bytes": staged.size_bytes,
        "shipped": [f for f, _ in staged.shipped],
        "files": sorted(str(p.relative_to(staged.working_dir)) for p in staged.working_dir.rglob("*") if p.is_file()),
        "metadata": {k: (redact_uri(v) if k == META_TRACKING_URI else v) for k, v in staged.metadata.items()},
        "warnings": list(staged.warnings),
    }
