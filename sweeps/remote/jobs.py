"""Sweeps as Ray Jobs: stage, submit, and read back (status, trial counts, logs, report, stop).

A submitted sweep is a Ray Job whose submission id is the sweep id. Its entrypoint is built here
(``python -m sweeps.cli run spec.yaml --output ... --sweep-id ... --no-progress``, every argument
quoted by :func:`shlex.join`): the spec travels as a file in the job's working directory, never
inside the command. That working directory is a fresh staging folder holding only the packages
(``sweeps``, ``workloads``, ``service``), ``pyproject.toml``, ``spec.yaml`` and, when small, the
data (the spec's paths are rewritten to the shipped copies). Its size is checked before upload.

Ray Jobs and MLflow are the whole record; readers keep no state. A sweep's status is Ray's job
status corrected by its MLflow runs (docs/design.md, "MLflow schema"): a job that exited 0 but
whose parent run says FAILED, or whose trials all failed, is FAILED. When Ray says a job has
ended (stopped or failed), MLflow runs of the sweep still marked RUNNING are closed, since the
process that would have closed them no longer exists (see :meth:`SweepJobs.get`).

This module imports neither torch nor Ray Tune: the REST service uses it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, urlsplit

import yaml

from sweeps.spec.identity import (
    check_sweep_id,
    default_sweep_id,
    is_loopback_address,
    is_valid_sweep_id,
    job_tracking_uri,
    redact_uri,
)
from sweeps.errors import CritbatchError, InvalidInput
from sweeps.spec import SpecError, SweepSpec, parse_spec

__all__ = [
    "SWEEP_STATUSES",
    "TERMINAL_STATUSES",
    "BackendTimeout",
    "ClusterUnavailable",
    "StoreRefused",
    "TooManySweeps",
    "SweepExists",
    "SweepNotFound",
    "ReportNotReady",
    "StagingError",
    "StagingLimits",
    "StagedSweep",
    "TrialCounts",
    "SweepState",
    "SweepJobs",
    "build_entrypoint",
    "check_existing_store",
    "default_job_python",
    "mlflow_ui_links",
    "stage_sweep",
    "staged_sweep",
    "staged_summary",
]

MiB = 1024 * 1024

#: What a reader reports, in order of a sweep's life.
SWEEP_STATUSES = ("PENDING", "RUNNING", "SUCCEEDED", "FAILED", "STOPPED")
TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})

#: A sweep id: also the Ray submission id, the MLflow parent run name and a folder name.

#: The packages a job needs; copied from wherever they are imported from.
PACKAGES = ("sweeps", "workloads", "service")
SPEC_FILE = "spec.yaml"
#: ``critbatch run``'s last resort, a file next to the job's working directory.
INPUTS_DIR = "inputs"
_COPY_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", ".*", "*.egg-info", "node_modules")

# Ray job metadata keys (strings only). The sweep id key marks a job as a critbatch sweep.
META_SWEEP_ID = "critbatch.sweep_id"
META_NAME = "critbatch.name"
META_FINGERPRINT = "critbatch.fingerprint"
META_EXPERIMENT = "critbatch.experiment"
META_TRACKING_URI = "critbatch.tracking_uri"
META_TRIALS_PLANNED = "critbatch.trials_planned"

# MLflow tags (docs/design.md).
TAG_SWEEP_ID = "critbatch.sweep_id"
TAG_ROLE = "critbatch.role"
TAG_STATUS = "critbatch.status"
TAG_TRIAL_ID = "critbatch.trial_id"
TAG_TRIALS_PLANNED = "critbatch.trials_planned"
#: The parent run's one-line outcome (why it failed), set by the driver.
TAG_MESSAGE = "critbatch.message"
#: Set on runs this module closes after their process ended.
TAG_CLOSED_BY = "critbatch.closed_by"
#: Trial tag value for a trial cut short by a stopped sweep (the driver's Tracker uses it too).
TRIAL_STOPPED = "STOPPED"
RESULT_METRICS = ("b_crit", "b_crit_tokens", "cbs_20", "s_min", "e_min", "target_loss")

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ---- errors ----------------------------------------------------------------------------------


class ClusterUnavailable(CritbatchError):
    """The Ray cluster's job server cannot be reached, or answered with an error."""


class BackendTimeout(ClusterUnavailable):
    """Ray's job server (or MLflow) did not answer in time."""


class TooManySweeps(CritbatchError):
    """``max_active`` sweeps are already pending or running on the cluster; nothing was submitted."""

    def __init__(self, active: int, max_active: int):
        self.active = active
        self.max_active = max_active
        super().__init__(f"{active} sweeps are pending or running (at most {max_active} at once): submit again later")


class StoreRefused(CritbatchError):
    """The tracking URI does not name an existing MLflow store: a reader never creates or migrates one."""


class SweepNotFound(CritbatchError):
    """No submitted sweep has this id on the cluster."""

    def __init__(self, sweep_id: str):
        self.sweep_id = sweep_id
        super().__init__(f"no sweep with id {sweep_id!r} on this cluster")


class SweepExists(CritbatchError):
    """A job with this sweep id was already submitted; no second job was started.

    Attributes:
        sweep_id: the id.
        status: the existing sweep's status.
        same_spec: True when the existing job runs the same spec (same fingerprint).
    """

    def __init__(self, sweep_id: str, status: str, same_spec: bool):
        self.sweep_id = sweep_id
        self.status = status
        self.same_spec = same_spec
        what = "the same spec" if same_spec else "a different spec"
        super().__init__(
            f"sweep {sweep_id!r} was already submitted ({what}; status {status}); "
            "no second job started (choose another --sweep-id to run it again)"
        )


class StagingError(InvalidInput):
    """What a submission would upload is refused (too big); ``path`` names the spec field or ``<root>``."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


class ReportNotReady(CritbatchError):
    """The sweep has no report (yet): it is still running, or ended without one."""

    def __init__(self, sweep_id: str, status: str, reason: str | None = None):
        self.sweep_id = sweep_id
        self.status = status
        self.reason = reason
        tail = f": {reason}" if reason else ""
        super().__init__(f"sweep {sweep_id!r} has no report (status {status}){tail}")


# ---- ids, URIs, entrypoint ---------------------------------------------------------------------


def default_job_python(address: str | None) -> str:
    """The Python that runs the job's entrypoint on the cluster.

    ``CRITBATCH_JOB_PYTHON`` if set; else this interpreter when the cluster is on this machine (a
    loopback address: same files, same environment); else ``python`` from the cluster's ``PATH``
    (the image's Python, with critbatch's dependencies installed).
    """
    env = os.environ.get("CRITBATCH_JOB_PYTHON")
    if env:
        return env
    return sys.executable if is_loopback_address(address) else "python"


def build_entrypoint(
    *, sweep_id: str, python: str = "python", tracking_uri: str | None = None, output_root: str = "outputs"
) -> str:
    """The job's shell command: ``critbatch run`` on the shipped ``spec.yaml``, every argument quoted.

    ``--address auto`` makes the driver join the cluster that runs the job (Ray sets
    ``RAY_ADDRESS`` for job entrypoints).
    """
    check_sweep_id(sweep_id)
    args = [
        python, "-m", "sweeps.cli", "run", SPEC_FILE,
        "--output", f"{output_root.rstrip('/') or '.'}/{sweep_id}",
        "--sweep-id", sweep_id,
        "--address", "auto",
        "--no-progress",
    ]
    if tracking_uri:
        args += ["--tracking-uri", tracking_uri]
    return shlex.join(args)


# ---- staging ---------------------------------------------------------------------------------


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
    def from_mb(cls, *, ship_data_max_mb: float | None = None, upload_max_mb: float | None = None) -> "StagingLimits":
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


#: Never shipped from an input folder: caches and build leftovers (and every name starting with '.').
_NOT_SHIPPED = ("__pycache__", "node_modules", "*.pyc", "*.pyo", "*.egg-info")


def _shipped(name: str) -> bool:
    import fnmatch

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
    return Path(list(found.submodule_search_locations)[0])


def _is_uri(path: str) -> bool:
    return re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def _inputs_of(spec: SweepSpec) -> list[tuple[str, str, str]]:
    """``(spec field, path, staged name)`` of every local input a job may need shipped."""
    out = [("data.path", spec.data.path, f"{INPUTS_DIR}/data/{Path(spec.data.path).name or 'data'}")]
    if spec.data.tokenizer != "byte":
        out.append(("data.tokenizer", spec.data.tokenizer, f"{INPUTS_DIR}/tokenizer"))
    if spec.finetune is not None:
        out.append(("finetune.checkpoint_dir", spec.finetune.checkpoint_dir, f"{INPUTS_DIR}/checkpoint"))
    return out


def _set_field(d: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for k in parents:
        d = d[k]
    d[leaf] = value


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
        sweep_id: the submission id; default :func:`default_sweep_id`.
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
        InvalidInput: a bad sweep id, an input too big to ship, or a working directory over
            ``limits.upload_max_bytes``.
    """
    sweep_id = check_sweep_id(sweep_id or default_sweep_id(spec))
    into = Path(into)
    if any(into.iterdir()):
        raise CritbatchError(f"staging folder {into} is not empty")
    root = Path(data_root).resolve() if data_root is not None else None
    base = root if root is not None else Path(base_dir).resolve()
    tracking_uri = job_tracking_uri(spec, tracking_uri, default_tracking_uri)
    warnings: list[str] = []

    # Inputs: ship the small local ones, rewrite the spec's paths to the shipped copies.
    data = spec.model_dump(mode="json")
    shipped: list[tuple[str, str]] = []
    for fld, path, staged_name in _inputs_of(spec):
        if _is_uri(path):
            continue
        local = Path(path) if Path(path).is_absolute() else base / path
        try:
            local = local.resolve()
        except (OSError, RuntimeError):
            continue
        if root is not None and not local.is_relative_to(root):
            continue  # not ours to ship: a path on the cluster
        if not local.exists():
            if not Path(path).is_absolute():
                warnings.append(
                    f"{fld} {path!r} does not exist here; the job will look for it relative to its working directory on the cluster"
                )
            continue
        if not ship_data:
            if not Path(path).is_absolute():
                warnings.append(f"{fld} {path!r} is relative and not shipped: the job resolves it on the cluster")
            continue
        if any(not _shipped(part) for part in Path(path).parts if part not in (".", "/")):
            raise StagingError(fld, f"{fld} {path!r}: hidden files and folders (names starting with '.') and caches "
                                    "are never shipped with a job")
        files = shippable_files(local) if local.is_dir() else [(local, Path(local.name))]
        size = sum(src.stat().st_size for src, _ in files)
        if size > limits.ship_data_max_bytes:
            raise StagingError(
                fld,
                f"{fld} {path!r} holds {_mb(size)} to ship, over the {_mb(limits.ship_data_max_bytes)} limit for data shipped "
                "with a job: put it where the cluster can read it (a shared filesystem or the image), set "
                f"{fld} to that path, and submit with --no-ship-data (or raise --ship-data-max-mb)"
            )
        dest = into / staged_name
        if local.is_dir():
            dest.mkdir(parents=True)
            for src, rel in files:
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(local, dest)
        _set_field(data, fld, staged_name)
        shipped.append((fld, path))

    try:
        staged_spec = parse_spec(data)
    except SpecError as exc:  # a rewritten path cannot make a valid spec invalid; guard anyway
        raise CritbatchError(f"staging changed the spec into an invalid one: {exc}") from None
    (into / SPEC_FILE).write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")

    # Code: the packages as imported here, and pyproject.toml when they come from a source tree.
    pkg_dirs = [_package_dir(p) for p in PACKAGES]
    for name, src in zip(PACKAGES, pkg_dirs):
        shutil.copytree(src, into / name, ignore=_COPY_IGNORE)
    pyproject = pkg_dirs[0].parent / "pyproject.toml"
    if pyproject.is_file():
        shutil.copy2(pyproject, into / "pyproject.toml")

    size = _tree_size(into)
    if size > limits.upload_max_bytes:
        biggest = sorted(((_tree_size(p), p.name) for p in into.iterdir()), reverse=True)[:3]
        parts = ", ".join(f"{n} {_mb(s)}" for s, n in biggest)
        raise StagingError(
            "<root>",
            f"the job's working directory is {_mb(size)}, over the {_mb(limits.upload_max_bytes)} upload limit "
            f"(largest: {parts}); reference big inputs by a path the cluster can read (--no-ship-data)"
        )

    if not _mlflow_readable(tracking_uri)[0]:
        warnings.append(
            f"tracking URI {redact_uri(tracking_uri)!r} is a file on the cluster node: status and reports cannot "
            "read it from here; use an MLflow server (--tracking-uri or MLFLOW_TRACKING_URI)"
        )

    metadata = {
        META_SWEEP_ID: sweep_id,
        META_NAME: spec.name,
        META_FINGERPRINT: spec.fingerprint(),
        META_EXPERIMENT: spec.experiment_name,
        META_TRACKING_URI: tracking_uri,
        META_TRIALS_PLANNED: str(spec.n_trials),
    }
    runtime_env = {
        "working_dir": str(into),
        # Belt and braces: the staging folder holds none of these.
        "excludes": [".git", ".venv", "venv", "__pycache__", "*.pyc", "outputs", "mlruns", "mlflow.db"],
        "env_vars": {"MLFLOW_TRACKING_URI": tracking_uri, "PYTHONUNBUFFERED": "1"},
    }
    if storage_root:
        runtime_env["env_vars"]["CRITBATCH_STORAGE_PATH"] = storage_root
    return StagedSweep(
        sweep_id=sweep_id,
        spec=staged_spec,
        fingerprint=spec.fingerprint(),
        tracking_uri=tracking_uri,
        working_dir=into,
        entrypoint=build_entrypoint(sweep_id=sweep_id, python=python, tracking_uri=tracking_uri, output_root=output_root),
        runtime_env=runtime_env,
        metadata=metadata,
        size_bytes=size,
        shipped=tuple(shipped),
        warnings=tuple(warnings),
    )


@contextlib.contextmanager
def staged_sweep(spec: SweepSpec, **kwargs: Any) -> Iterator[StagedSweep]:
    """:func:`stage_sweep` into a temporary folder that is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="critbatch-job-") as tmp:
        yield stage_sweep(spec, Path(tmp), **kwargs)


# ---- status ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrialCounts:
    """Trials by their MLflow ``critbatch.status`` tag.

    ``done`` counts trials that completed normally (``COMPLETED``); ``diverged``, ``failed``,
    ``pruned`` and ``stopped`` (cut short by a stop) are the other ways a trial ends.
    """

    planned: int | None = None
    done: int = 0
    running: int = 0
    failed: int = 0
    diverged: int = 0
    pruned: int = 0
    stopped: int = 0

    @property
    def finished(self) -> int:
        return self.done + self.failed + self.diverged + self.pruned + self.stopped


@dataclass(frozen=True, kw_only=True)
class SweepState:
    """What a reader knows about one sweep: Ray's job record plus its MLflow runs."""

    id: str
    status: str
    ray_status: str
    name: str | None = None
    reason: str | None = None
    submitted_at: str | None = None
    ended_at: str | None = None
    trials: TrialCounts | None = None
    best: dict[str, Any] | None = None
    result: dict[str, float] | None = None
    tracking_uri: str | None = None
    experiment_id: str | None = None
    parent_run_id: str | None = None
    mlflow_error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tracking_uri"] = redact_uri(self.tracking_uri)
        return d


def _iso(ms: int | None) -> str | None:
    if not ms:
        return None
    return datetime.fromtimestamp(ms / 1000.0, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _mlflow_readable(uri: str | None) -> tuple[bool, str | None]:
    """Whether this process can read the MLflow store at ``uri``: a server, or a local file that exists.

    A relative ``sqlite:///mlflow.db`` recorded by a job names a file on the cluster node.
    """
    if not uri:
        return False, "no tracking URI recorded"
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        p = Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else Path("")
    elif scheme == "file":
        p = Path(parts.path)
    elif scheme == "":
        p = Path(uri)
    else:
        return True, None
    if p.is_absolute() and p.exists():
        return True, None
    return False, f"tracking URI {redact_uri(uri)!r} is a file on the cluster node, not readable here"


def _failure_reason(job: Any) -> str | None:
    """One line on why a job failed: the driver's last error line, else Ray's message."""
    msg = _ANSI_RE.sub("", job.message or "")
    code = getattr(job, "driver_exit_code", None)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip()]
    if not lines:
        return f"exit code {code}" if code is not None else None
    if "last available logs" in lines[0] and len(lines) > 1:
        logs = lines[1:]
        picked = next((ln for ln in reversed(logs) if re.match(r"(sweep failed|error)\b", ln, re.I)), logs[-1])
        prefix = "invalid input (exit code 2)" if code == 2 else (f"exit code {code}" if code is not None else "failed")
        return f"{prefix}: {picked}"[:2000]
    return lines[0][:2000]


def _counts(trials: list[Any], planned: int | None) -> TrialCounts:
    c: Counter[str] = Counter()
    for r in trials:
        tag = r.data.tags.get(TAG_STATUS, "RUNNING")
        if tag == "PAUSED":  # waiting at a rung (pruning.mode: pause): still part of the live sweep
            tag = "RUNNING"
        if tag == "RUNNING" and r.info.status != "RUNNING":
            tag = TRIAL_STOPPED if r.info.status == "KILLED" else "FAILED"
        c[tag] += 1
    return TrialCounts(
        planned=planned, done=c["COMPLETED"], running=c["RUNNING"], failed=c["FAILED"],
        diverged=c["DIVERGED"], pruned=c["PRUNED"], stopped=c[TRIAL_STOPPED],
    )


def _final_counts(parent: Any | None, planned: int | None) -> TrialCounts | None:
    """The trial counts the driver logged on the parent run when the sweep ended (``trials_*`` metrics)."""
    if parent is None or "trials_completed" not in parent.data.metrics:
        return None
    m = parent.data.metrics

    def n(key: str) -> int:
        v = m.get(f"trials_{key}")
        return int(v) if v is not None and math.isfinite(v) else 0

    return TrialCounts(planned=planned, done=n("completed"), running=0, failed=n("failed"), diverged=n("diverged"),
                       pruned=n("pruned"), stopped=n("stopped"))


def _best(trials: list[Any]) -> dict[str, Any] | None:
    best = None
    for r in trials:
        v = r.data.metrics.get("val_loss")
        if v is None or not math.isfinite(v):
            continue
        if best is None or v < best.data.metrics["val_loss"]:
            best = r
    if best is None:
        return None
    p = best.data.params
    out: dict[str, Any] = {
        "trial_id": best.data.tags.get(TAG_TRIAL_ID),
        "run_id": best.info.run_id,
        "status": best.data.tags.get(TAG_STATUS),
        "val_loss": best.data.metrics["val_loss"],
    }
    for k, conv in (("batch_size_sequences", int), ("lr", float), ("lr_rule", str), ("beta2", float)):
        if k in p:
            try:
                out[k] = conv(float(p[k])) if conv is int else conv(p[k])
            except ValueError:
                out[k] = p[k]
    return out


def mlflow_ui_links(ui_url: str | None, experiment_id: str | None, parent_run_id: str | None, trial_run_ids: list[str]) -> dict[str, Any]:
    """Links into the MLflow UI at ``ui_url``: the experiment, the parent run, each trial, the comparison."""
    if not ui_url or not experiment_id:
        return {}
    base = ui_url.rstrip("/")
    links: dict[str, Any] = {"experiment": f"{base}/#/experiments/{experiment_id}"}
    if parent_run_id:
        links["parent_run"] = f"{base}/#/experiments/{experiment_id}/runs/{parent_run_id}"
    if trial_run_ids:
        runs = quote("[" + ",".join(f'"{r}"' for r in trial_run_ids) + "]", safe="")
        exps = quote(f'["{experiment_id}"]', safe="")
        links["compare_trials"] = f"{base}/#/compare-runs?runs={runs}&experiments={exps}"
    return links


_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def check_existing_store(uri: str) -> None:
    """Refuse a tracking URI that does not name an existing MLflow store.

    MLflow's SQL store creates its tables (and runs its migrations) when a database lacks them,
    and adds a default experiment when it has none; its file store creates its folder. A reader
    must do neither: a SQL database is inspected first (SQLite opened read-only) and must hold
    every MLflow table and the default experiment; a file store's folder must hold experiment
    ``0``. HTTP(S) servers and other schemes are left to MLflow.

    Raises:
        StoreRefused: no such database or folder, or not an MLflow store.
    """
    parts = urlsplit(uri)
    scheme = parts.scheme.lower().split("+", 1)[0]
    if scheme in ("http", "https", "databricks", "mlflow-artifacts"):
        return
    if scheme in _DB_SCHEMES:
        import sqlalchemy

        if scheme == "sqlite":
            path = uri.split(":///", 1)[1] if ":///" in uri else ""
            if not path or path == ":memory:" or not Path(path).is_file():
                raise StoreRefused(f"no MLflow database at {redact_uri(uri)!r} (a reader creates none)")
            url = f"sqlite:///file:{quote(str(Path(path).resolve()))}?mode=ro&uri=true"
        else:
            url = uri
        try:
            from mlflow.store.db.db_types import DATABASE_ENGINES  # noqa: F401 - MLflow's drivers
            from mlflow.store.tracking.dbmodels.models import Base

            engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 10} if scheme != "sqlite" else {})
            try:
                tables = set(sqlalchemy.inspect(engine).get_table_names())
                missing = set(Base.metadata.tables) - tables
                has_default = False
                if not missing:
                    with engine.connect() as conn:
                        has_default = conn.execute(
                            sqlalchemy.text("SELECT 1 FROM experiments WHERE experiment_id = 0")).first() is not None
            finally:
                engine.dispose()
        except Exception as exc:  # noqa: BLE001 - driver errors of any kind
            raise StoreRefused(f"cannot open {redact_uri(uri)!r} read-only ({type(exc).__name__})") from None
        if missing or not has_default:
            raise StoreRefused(f"{redact_uri(uri)!r} is not an MLflow store (no MLflow tables): a reader creates none")
        return
    if scheme in ("", "file"):
        root = Path(parts.path if scheme == "file" else uri)
        if not (root / "0" / "meta.yaml").is_file():
            raise StoreRefused(f"{redact_uri(uri)!r} is not an MLflow file store: a reader creates none")


class _MlflowReader:
    """The sweep's runs in one MLflow store (explicit client, no active-run state).

    Raises:
        StoreRefused: ``tracking_uri`` names no existing MLflow store (see :func:`check_existing_store`).
    """

    def __init__(self, tracking_uri: str):
        from mlflow import MlflowClient

        check_existing_store(tracking_uri)
        self.uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri)

    def experiment_ids(self, name: str | None) -> list[str]:
        if name:
            exp = self.client.get_experiment_by_name(name)
            return [exp.experiment_id] if exp is not None else []
        return [e.experiment_id for e in self.client.search_experiments(max_results=1000)]

    def parent(self, sweep_id: str, exp_ids: list[str]) -> Any | None:
        if not exp_ids:
            return None
        runs = self.client.search_runs(
            exp_ids,
            filter_string=f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{TAG_ROLE}` = 'sweep'",
            max_results=1,
            order_by=["attributes.start_time DESC"],
        )
        return runs[0] if runs else None

    def trials(self, sweep_id: str, exp_ids: list[str]) -> list[Any]:
        out: list[Any] = []
        token = None
        while exp_ids:
            page = self.client.search_runs(
                exp_ids,
                filter_string=f"tags.`{TAG_SWEEP_ID}` = '{sweep_id}' and tags.`{TAG_ROLE}` = 'trial'",
                max_results=1000,
                page_token=token,
            )
            out.extend(page)
            token = page.token
            if not token:
                break
        return out

    def close_orphans(self, parent: Any | None, trials: list[Any], sweep_status: str) -> int:
        """Close runs still RUNNING after the job ended; return how many were closed."""
        closed = 0
        trial_tag = TRIAL_STOPPED if sweep_status == "STOPPED" else "FAILED"
        for r in trials:
            tag = r.data.tags.get(TAG_STATUS)
            if r.info.status == "RUNNING" or tag == "RUNNING":
                if tag in (None, "RUNNING"):
                    self.client.set_tag(r.info.run_id, TAG_STATUS, trial_tag)
                self.client.set_tag(r.info.run_id, TAG_CLOSED_BY, "critbatch.jobs")
                if r.info.status == "RUNNING":
                    self.client.set_terminated(r.info.run_id, status="KILLED" if sweep_status == "STOPPED" else "FAILED")
                closed += 1
        if parent is not None and (parent.info.status == "RUNNING" or parent.data.tags.get(TAG_STATUS) == "RUNNING"):
            if parent.data.tags.get(TAG_STATUS) in (None, "RUNNING"):
                self.client.set_tag(parent.info.run_id, TAG_STATUS, sweep_status)
                if not parent.data.tags.get(TAG_MESSAGE):
                    self.client.set_tag(
                        parent.info.run_id, TAG_MESSAGE, f"closed after the Ray job ended ({sweep_status})"
                    )
            self.client.set_tag(parent.info.run_id, TAG_CLOSED_BY, "critbatch.jobs")
            if parent.info.status == "RUNNING":
                self.client.set_terminated(parent.info.run_id, status="KILLED" if sweep_status == "STOPPED" else "FAILED")
            closed += 1
        return closed

    def load_json_artifact(self, run_id: str, path: str) -> Any | None:
        import json

        with tempfile.TemporaryDirectory(prefix="critbatch-report-") as tmp:
            try:
                local = self.client.download_artifacts(run_id, path, tmp)
            except Exception:  # noqa: BLE001 - MLflow raises several types for a missing artifact
                return None
            return json.loads(Path(local).read_text(encoding="utf-8"))


# ---- the client ----------------------------------------------------------------------------------


_ENV_LOCK = threading.Lock()
#: Tries of one submission when the connection drops (the upload and the submission id make it idempotent).
SUBMIT_ATTEMPTS = 3
#: ``wait`` gives up after this many reads in a row that could not reach the cluster.
WAIT_MAX_CONSECUTIVE_ERRORS = 5


def _make_client(address: str | None, headers: dict[str, str] | None, timeout_s: float | None = None) -> Any:
    """A ``JobSubmissionClient`` for exactly ``address``; with ``timeout_s``, every HTTP request it
    makes (the version check in its constructor included) gives up after that long.

    Ray lets ``RAY_API_SERVER_ADDRESS`` / ``RAY_ADDRESS`` override the ``address`` argument; an
    explicit address must win, so they are hidden while the client resolves its address.
    """
    from ray.job_submission import JobSubmissionClient

    if timeout_s is not None:
        class _TimedClient(JobSubmissionClient):
            def _do_request(self, method, endpoint, **kwargs):  # noqa: ANN001 - Ray's signature
                kwargs.setdefault("timeout", timeout_s)
                return super()._do_request(method, endpoint, **kwargs)

        JobSubmissionClient = _TimedClient  # noqa: N806

    if address is None:
        return JobSubmissionClient(None, headers=headers)
    keys = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
    if all(os.environ.get(k) in (None, address) for k in keys):
        return JobSubmissionClient(address, headers=headers)
    with _ENV_LOCK:
        saved = {k: os.environ.pop(k) for k in keys if k in os.environ}
        try:
            return JobSubmissionClient(address, headers=headers)
        finally:
            os.environ.update(saved)


def _is_not_found(exc: Exception) -> bool:
    s = str(exc)
    return "status code 404" in s or "does not exist" in s


class SweepJobs:
    """Submitted sweeps on one Ray cluster, read back from Ray Jobs and MLflow.

    Args:
        address: the cluster's job server (``http://HEAD:8265``), or any address Ray resolves.
        headers: extra HTTP headers for the job server (Ray's own token is added by Ray when
            ``RAY_AUTH_MODE=token``).
        tracking_uri: the MLflow URI used when a job's metadata does not record one.
        client: an object with ``JobSubmissionClient``'s methods (tests); default connects lazily.
        reader_factory: ``tracking_uri -> reader`` (tests); default an MLflow client.
        only_tracking_uri: read MLflow at ``tracking_uri`` only: a job whose metadata records
            another URI is shown with ``mlflow_error`` and never contacted (the service: it would
            call that URI with its own credentials).
        public_errors: error texts name no address and quote no remote answer (the service).
        ray_timeout_s: the longest one HTTP request to the job server may take
            (:class:`BackendTimeout` after it).
        list_cache_s: :meth:`list` answers at most this old are shared (0: every call reads).
    """

    def __init__(
        self,
        address: str | None,
        *,
        headers: dict[str, str] | None = None,
        tracking_uri: str | None = None,
        client: Any | None = None,
        reader_factory: Callable[[str], Any] | None = None,
        only_tracking_uri: bool = False,
        public_errors: bool = False,
        ray_timeout_s: float | None = None,
        list_cache_s: float = 0.0,
    ):
        self.address = address
        self._headers = headers
        self._client = client
        self._lock = threading.Lock()
        self.tracking_uri = tracking_uri
        self._reader_factory = reader_factory or _MlflowReader
        self.only_tracking_uri = only_tracking_uri
        self.public_errors = public_errors
        self.ray_timeout_s = ray_timeout_s
        self.list_cache_s = list_cache_s
        self._list_lock = threading.Lock()
        self._list_cache: dict[tuple, tuple[float, Any]] = {}

    # -- plumbing

    @property
    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                try:
                    self._client = _make_client(self.address, self._headers, self.ray_timeout_s)
                except Exception as exc:  # noqa: BLE001 - requests/ConnectionError/RuntimeError
                    raise self._unavailable(exc) from None
            return self._client

    def _unavailable(self, exc: Exception, what: str = "cannot reach the Ray job server") -> ClusterUnavailable:
        timed_out = type(exc).__name__ in ("Timeout", "ReadTimeout", "ConnectTimeout", "TimeoutError")
        if timed_out:
            return BackendTimeout(f"the Ray job server did not answer within {self.ray_timeout_s or 0:g} s")
        if self.public_errors:
            return ClusterUnavailable(f"{what} ({type(exc).__name__})")
        return ClusterUnavailable(f"{what} at {self.address or '(auto)'}: {exc}")

    def _call(self, fn: str, *args: Any, sweep_id: str | None = None, **kwargs: Any) -> Any:
        try:
            return getattr(self.client, fn)(*args, **kwargs)
        except (ClusterUnavailable, SweepNotFound):
            raise
        except RuntimeError as exc:
            if sweep_id is not None and _is_not_found(exc):
                raise SweepNotFound(sweep_id) from None
            if self.public_errors:
                raise ClusterUnavailable("the Ray job server answered with an error") from None
            raise ClusterUnavailable(f"Ray job server error: {str(exc)[:2000]}") from None
        except Exception as exc:  # noqa: BLE001 - connection errors of requests
            raise self._unavailable(exc) from None

    def _job(self, sweep_id: str) -> Any:
        if not is_valid_sweep_id(sweep_id):
            raise SweepNotFound(sweep_id)
        job = self._call("get_job_info", sweep_id, sweep_id=sweep_id)
        if META_SWEEP_ID not in (job.metadata or {}):
            raise SweepNotFound(sweep_id)  # a Ray job, but not a sweep
        return job

    def _tracking_uri_of(self, job: Any) -> str | None:
        return (job.metadata or {}).get(META_TRACKING_URI) or self.tracking_uri

    def _foreign_uri(self, uri: str | None) -> bool:
        """``only_tracking_uri``: whether ``uri`` is not the one store this reader may contact."""
        return self.only_tracking_uri and (not uri or not self.tracking_uri
                                           or uri.rstrip("/") != self.tracking_uri.rstrip("/"))

    # -- commands

    def active_count(self) -> int:
        """Sweeps (critbatch jobs) that Ray reports PENDING or RUNNING."""
        return sum(1 for j in self._call("list_jobs") if META_SWEEP_ID in (j.metadata or {})
                   and str(getattr(j.status, "value", j.status)) in ("PENDING", "RUNNING"))

    def ping_ray(self) -> str:
        """``"ok"`` if the job server answers (its version route), else raises :class:`ClusterUnavailable`."""
        client = self.client
        self._call("get_version") if hasattr(client, "get_version") else self._call("list_jobs")
        return "ok"

    def ping_mlflow(self, timeout_s: float = 2.0) -> str:
        """``"ok"`` if the tracking store answers (an HTTP server's ``/health``, or an existing
        store: :func:`check_existing_store`), ``"not configured"`` without one; else raises."""
        uri = self.tracking_uri
        if not uri:
            return "not configured"
        if urlsplit(uri).scheme.lower() in ("http", "https"):
            import requests

            r = requests.get(uri.rstrip("/") + "/health", timeout=timeout_s)
            if r.status_code != 200:
                raise StoreRefused(f"MLflow answered {r.status_code}")
            return "ok"
        check_existing_store(uri)
        return "ok"

    def submit(self, staged: StagedSweep, *, max_active: int | None = None) -> SweepState:
        """Submit a staged sweep, unless a job with its id exists (then :class:`SweepExists`), or
        ``max_active`` sweeps are pending or running already (then :class:`TooManySweeps`)."""
        try:
            existing = self._job(staged.sweep_id)
        except SweepNotFound:
            existing = None
        if existing is not None:
            same = (existing.metadata or {}).get(META_FINGERPRINT) == staged.fingerprint
            raise SweepExists(staged.sweep_id, self._state(existing, with_mlflow=False).status, same)
        if max_active is not None:
            active = self.active_count()
            if active >= max_active:
                raise TooManySweeps(active, max_active)
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                self.client.submit_job(
                    entrypoint=staged.entrypoint,
                    submission_id=staged.sweep_id,
                    runtime_env=staged.runtime_env,
                    metadata=dict(staged.metadata),
                )
                break
            except ClusterUnavailable:
                raise
            except RuntimeError as exc:
                if "already exists" not in str(exc):
                    raise ClusterUnavailable(f"Ray job server refused the job: {str(exc)[:2000]}") from None
                # A lost race with another submission of this id (first attempt), or an earlier
                # attempt of ours that reached the server although its answer was lost.
                job = self._job(staged.sweep_id)
                same = (job.metadata or {}).get(META_FINGERPRINT) == staged.fingerprint
                if attempt == 0 or not same:
                    raise SweepExists(staged.sweep_id, self._state(job, with_mlflow=False).status, same) from None
                break
            except Exception as exc:  # noqa: BLE001 - connection dropped (requests/urllib3 errors): retry
                if attempt + 1 == SUBMIT_ATTEMPTS:
                    raise ClusterUnavailable(f"cannot submit to the Ray job server at {self.address}: {exc}") from None
                time.sleep(2.0 * (attempt + 1))
        self._list_cache.clear()
        return SweepState(
            id=staged.sweep_id, status="PENDING", ray_status="PENDING", name=staged.spec.name,
            tracking_uri=staged.tracking_uri, trials=TrialCounts(planned=staged.spec.n_trials),
        )

    def get(self, sweep_id: str, *, with_mlflow: bool = True, reconcile: bool = True) -> SweepState:
        """The sweep's status, trial counts and best result so far.

        With ``reconcile``, a sweep whose job has ended as STOPPED or FAILED gets its MLflow runs
        that are still RUNNING closed (their writer is gone): no orphan RUNNING runs remain.

        Raises:
            SweepNotFound, ClusterUnavailable.
        """
        return self._state(self._job(sweep_id), with_mlflow=with_mlflow, reconcile=reconcile)

    def list(self, *, limit: int = 20, offset: int = 0, with_mlflow: bool = True) -> tuple[list[SweepState], int]:
        """Sweeps on the cluster, newest first: ``(page, total)``.

        With ``list_cache_s``, concurrent and repeated calls within that many seconds share one
        answer (one call to Ray's job list, one MLflow read per listed sweep): status only, so a
        second old at most.
        """
        key = (limit, offset, with_mlflow)
        if self.list_cache_s <= 0:
            return self._list(limit, offset, with_mlflow)
        with self._list_lock:  # single flight: callers arriving while one computes wait for its answer
            hit = self._list_cache.get(key)
            if hit is not None and time.monotonic() - hit[0] < self.list_cache_s:
                return hit[1]
            out = self._list(limit, offset, with_mlflow)
            if len(self._list_cache) > 64:
                self._list_cache.clear()
            self._list_cache[key] = (time.monotonic(), out)
            return out

    def _list(self, limit: int, offset: int, with_mlflow: bool) -> tuple[list[SweepState], int]:
        jobs = [j for j in self._call("list_jobs") if META_SWEEP_ID in (j.metadata or {}) and j.submission_id]
        jobs.sort(key=lambda j: (j.start_time or 0, j.submission_id), reverse=True)
        page = jobs[offset : offset + limit]
        return [self._state(j, with_mlflow=with_mlflow, reconcile=False, with_trials=False) for j in page], len(jobs)

    def logs(self, sweep_id: str, *, tail_lines: int | None = None) -> str:
        self._job(sweep_id)
        text = self._call("get_job_logs", sweep_id, sweep_id=sweep_id) or ""
        if tail_lines is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail_lines:]) if tail_lines > 0 else ""
        return text

    async def follow_logs(self, sweep_id: str):
        """Yield chunks of the job's log as they are written, until the job ends."""
        self._job(sweep_id)
        async for chunk in self.client.tail_job_logs(sweep_id):
            yield chunk

    def stop(self, sweep_id: str, *, wait_s: float = 60.0, poll_s: float = 0.5) -> tuple[SweepState, bool]:
        """Stop the sweep's job and wait (up to ``wait_s``) until Ray reports it ended.

        Returns:
            ``(state, stop_sent)``: ``stop_sent`` is False when the job had already ended.
        """
        job = self._job(sweep_id)
        sent = False
        if not job.status.is_terminal():
            sent = bool(self._call("stop_job", sweep_id, sweep_id=sweep_id))
        deadline = time.monotonic() + wait_s
        while not job.status.is_terminal() and time.monotonic() < deadline:
            time.sleep(poll_s)
            job = self._job(sweep_id)
        return self._state(job, with_mlflow=True, reconcile=True), sent

    def wait(self, sweep_id: str, *, timeout_s: float = 3600.0, poll_s: float = 2.0,
             on_update: Callable[[SweepState], None] | None = None) -> SweepState:
        """Poll until the sweep ends (or ``timeout_s`` passes); return the last state."""
        deadline = time.monotonic() + timeout_s
        errors = 0
        while True:
            try:
                state = self.get(sweep_id)
                errors = 0
            except ClusterUnavailable:
                errors += 1  # a busy head node may drop a request now and then
                if errors >= WAIT_MAX_CONSECUTIVE_ERRORS or time.monotonic() >= deadline:
                    raise
                time.sleep(poll_s)
                continue
            if on_update is not None:
                on_update(state)
            if state.terminal or time.monotonic() >= deadline:
                return state
            time.sleep(poll_s)

    def report(self, sweep_id: str, *, ui_url: str | None = None) -> dict[str, Any]:
        """The sweep's ``cbs.json`` (from its MLflow parent run) with links to its MLflow runs.

        Raises:
            SweepNotFound; ReportNotReady while it runs, or when it ended without a report.
        """
        job = self._job(sweep_id)
        uri = self._tracking_uri_of(job)
        state = self._state(job, with_mlflow=True, reconcile=True)
        if not state.terminal:
            raise ReportNotReady(sweep_id, state.status, "the sweep has not finished")
        if state.mlflow_error or state.parent_run_id is None or self._foreign_uri(uri):
            raise ReportNotReady(sweep_id, state.status, state.mlflow_error or state.reason or "no MLflow parent run")
        reader = self._reader_factory(uri)
        cbs = reader.load_json_artifact(state.parent_run_id, "cbs.json")
        if cbs is None:
            raise ReportNotReady(sweep_id, state.status, state.reason or "the parent run has no cbs.json")
        exp_ids = [state.experiment_id] if state.experiment_id else []
        trials = reader.trials(sweep_id, exp_ids)
        if ui_url is None and urlsplit(uri or "").scheme in ("http", "https"):
            ui_url = redact_uri(uri)
        trial_rows = sorted(
            (
                {
                    "trial_id": r.data.tags.get(TAG_TRIAL_ID),
                    "run_id": r.info.run_id,
                    "status": r.data.tags.get(TAG_STATUS),
                    "batch_size_sequences": r.data.params.get("batch_size_sequences"),
                    "val_loss": r.data.metrics.get("val_loss"),
                }
                for r in trials
            ),
            key=lambda t: str(t["trial_id"]),
        )
        links = mlflow_ui_links(ui_url, state.experiment_id, state.parent_run_id, [t["run_id"] for t in trial_rows])
        if ui_url and state.experiment_id:
            for t in trial_rows:
                t["url"] = f"{ui_url.rstrip('/')}/#/experiments/{state.experiment_id}/runs/{t['run_id']}"
        return {
            "id": sweep_id,
            "status": state.status,
            "cbs": cbs,
            "mlflow": {
                "tracking_uri": redact_uri(uri),
                "experiment_id": state.experiment_id,
                "parent_run_id": state.parent_run_id,
                "trial_runs": trial_rows,
                "links": links,
            },
        }

    # -- composing a state

    def _state(self, job: Any, *, with_mlflow: bool, reconcile: bool = False, with_trials: bool = True) -> SweepState:
        md = job.metadata or {}
        sweep_id = job.submission_id or md.get(META_SWEEP_ID)
        ray_status = str(getattr(job.status, "value", job.status))
        status = ray_status if ray_status in SWEEP_STATUSES else "FAILED"
        reason = None
        if status == "FAILED":
            reason = _failure_reason(job)
        elif status == "STOPPED":
            reason = "stopped by request"
        planned = int(md[META_TRIALS_PLANNED]) if md.get(META_TRIALS_PLANNED, "").isdigit() else None
        base = dict(
            id=sweep_id, ray_status=ray_status, name=md.get(META_NAME),
            submitted_at=_iso(job.start_time), ended_at=_iso(job.end_time),
            tracking_uri=self._tracking_uri_of(job),
        )
        if not with_mlflow:
            return SweepState(status=status, reason=reason, **base)

        uri = self._tracking_uri_of(job)
        ok, why = _mlflow_readable(uri)
        if ok and self._foreign_uri(uri):
            ok, why = False, "the sweep logs to a tracking URI that this service does not read"
        if not ok:
            return SweepState(status=status, reason=reason, mlflow_error=why, **base)
        try:
            reader = self._reader_factory(uri)
            exp_ids = reader.experiment_ids(md.get(META_EXPERIMENT))
            parent = reader.parent(sweep_id, exp_ids)
            trials = reader.trials(sweep_id, exp_ids) if (with_trials or status == "SUCCEEDED") else []
            if reconcile and status in ("STOPPED", "FAILED") and (
                (parent is not None and parent.info.status == "RUNNING")
                or any(r.info.status == "RUNNING" or r.data.tags.get(TAG_STATUS) == "RUNNING" for r in trials)
            ):
                reader.close_orphans(parent, trials, status)
                parent = reader.parent(sweep_id, exp_ids)
                trials = reader.trials(sweep_id, exp_ids)
        except Exception as exc:  # noqa: BLE001 - MLflow unreachable or erroring: Ray's view still stands
            if self.public_errors:  # neither the server's answer nor its address goes to the client
                why = "no MLflow store there" if isinstance(exc, StoreRefused) else f"MLflow could not be read ({type(exc).__name__})"
            else:
                why = f"cannot read MLflow at {redact_uri(uri)}: {exc}"[:2000]
            return SweepState(status=status, reason=reason, mlflow_error=why, **base)

        if parent is not None and planned is None:
            tp = parent.data.tags.get(TAG_TRIALS_PLANNED, "")
            planned = int(tp) if tp.isdigit() else None
        counts = _counts(trials, planned) if (with_trials or status == "SUCCEEDED") else None
        final = _final_counts(parent, planned) if status in TERMINAL_STATUSES else None
        if final is not None and counts is not None:
            counts = final  # the driver's own summary of a finished sweep wins over the child runs
        parent_tag = parent.data.tags.get(TAG_STATUS) if parent is not None else None
        parent_msg = parent.data.tags.get(TAG_MESSAGE) if parent is not None else None
        # Honest status: exit 0 is not enough when MLflow says otherwise.
        if status == "SUCCEEDED":
            if parent_tag == "FAILED":
                status, reason = "FAILED", parent_msg or "the sweep's parent run is marked FAILED"
            elif counts is not None and counts.finished > 0 and counts.done == 0 and counts.failed == counts.finished:
                status, reason = "FAILED", "every trial failed"
        elif status == "FAILED" and parent_tag == "FAILED" and parent_msg:
            reason = parent_msg
        result = None
        if parent is not None:
            result = {k: parent.data.metrics[k] for k in RESULT_METRICS if k in parent.data.metrics} or None
        return SweepState(
            status=status, reason=reason,
            trials=counts if with_trials else None,
            best=_best(trials) if with_trials else None,
            result=result,
            experiment_id=parent.info.experiment_id if parent is not None else (exp_ids[0] if len(exp_ids) == 1 else None),
            parent_run_id=parent.info.run_id if parent is not None else None,
            **base,
        )


def staged_summary(staged: StagedSweep) -> dict[str, Any]:
    """A JSON-able summary of a staged submission (for ``--dry-run`` and logs)."""
    return {
        "sweep_id": staged.sweep_id,
        "entrypoint": staged.entrypoint,
        "size_bytes": staged.size_bytes,
        "shipped": [f for f, _ in staged.shipped],
        "files": sorted(str(p.relative_to(staged.working_dir)) for p in staged.working_dir.rglob("*") if p.is_file()),
        "metadata": {k: (redact_uri(v) if k == META_TRACKING_URI else v) for k, v in staged.metadata.items()},
        "warnings": list(staged.warnings),
    }

