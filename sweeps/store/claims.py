"""Who owns a sweep: the output folder claimed by one driver at a time (``flock`` plus an exclusive
``sweep.json``), and a sweep id bound to its spec's fingerprint wherever the sweep keeps state (the
shared storage root, MLflow parent runs, Optuna studies), so that one id never mixes two specs. The shared
storage root's binding also records the content hashes of the sweep's inputs, which a retried job is
checked against (``sweeps.store.inputs``), since the fingerprint holds their paths only.

Each refusal is an :class:`~sweeps.errors.InvalidInput` naming the folder or store and the holder.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from sweeps.errors import InvalidInput
from sweeps.files import write_json
from sweeps.spec.statuses import SweepStatus
from sweeps.store.migrations import SWEEP_JSON_VERSION, VERSION_KEY, read_sweep_json

__all__ = [
    "LOCK_FILE",
    "STORAGE_BINDING_FILE",
    "OutputClaim",
    "check_sweep_id_binding",
    "claim_output_folder",
    "lock_output_folder",
    "read_storage_binding",
    "write_storage_binding",
]


#: the file in a sweep's shared storage root (``resources.storage_path/<sweep id>``) that binds its
#: sweep id to its spec's fingerprint and records its inputs' content hashes
STORAGE_BINDING_FILE = "critbatch-sweep.json"


def _fs_of(root: str):
    """``(pyarrow filesystem, path)`` of a storage root (a local folder or a URI such as ``s3://``)."""
    import pyarrow.fs

    if "://" in root:
        return pyarrow.fs.FileSystem.from_uri(root)
    return pyarrow.fs.LocalFileSystem(), str(Path(root).expanduser().resolve())


def read_storage_binding(root: str) -> dict | None:
    """The ``{"sweep_id", "fingerprint", "inputs"}`` stored in a sweep's storage root, or None if there is none
    (``inputs`` is missing in a binding written before inputs were recorded there)."""
    fs, path = _fs_of(root)
    try:
        with fs.open_input_stream(f"{path}/{STORAGE_BINDING_FILE}") as f:
            return json.loads(f.read().decode())
    except (FileNotFoundError, OSError, ValueError):
        return None


def write_storage_binding(root: str, sweep_id: str, fingerprint: str, inputs: dict | None = None) -> None:
    """Record in the storage root which spec (by fingerprint) this sweep id runs, and on which inputs
    (:func:`sweeps.store.inputs.pin_inputs`; None: not recorded). Whole or not at all: a local root through
    :func:`sweeps.files.write_json`, an object store by its own single put.

    Raises:
        WriteFailed: a local write failed; the previous binding is unchanged.
    """
    data = {"sweep_id": sweep_id, "fingerprint": fingerprint, "inputs": inputs}
    fs, path = _fs_of(root)
    fs.create_dir(path, recursive=True)
    if "://" not in root:
        write_json(Path(path) / STORAGE_BINDING_FILE, data)
        return
    with fs.open_output_stream(f"{path}/{STORAGE_BINDING_FILE}") as f:
        f.write(json.dumps(data).encode())


def check_sweep_id_binding(
    sweep_id: str,
    fingerprint: str,
    *,
    storage_root: str | None = None,
    mlflow_parents: list | None = None,
    optuna_storage: str | None = None,
) -> None:
    """Refuse a spec other than the one a sweep id already runs, wherever the id is stored.

    Args:
        sweep_id: the sweep id asked for.
        fingerprint: :meth:`SweepSpec.fingerprint` of the spec as given.
        storage_root: the sweep's shared storage root (``resources.storage_path/<sweep id>``), if any.
        mlflow_parents: ``(run id, fingerprint tag or None)`` of MLflow parent runs with this sweep id.
        optuna_storage: an Optuna RDB URL shared beyond the output folder (``CRITBATCH_OPTUNA_STORAGE``).

    Raises:
        InvalidInput: the storage root, an MLflow parent run or an Optuna study of this sweep id
            records another fingerprint (a resumed sweep would run the old spec's trials and
            report the old batch sizes under the new spec).
    """

    def refuse(where: str, other: str) -> None:
        raise InvalidInput(
            f"--sweep-id {sweep_id!r} already runs another spec (fingerprint {other}, {where}); this spec's "
            f"fingerprint is {fingerprint}: choose another --sweep-id, or run the original spec to resume it"
        )

    if storage_root is not None:
        bound = read_storage_binding(storage_root)
        if bound is not None and bound.get("fingerprint") not in (None, fingerprint):
            refuse(f"in {storage_root}/{STORAGE_BINDING_FILE}", bound["fingerprint"])
    for run_id, fp in mlflow_parents or []:
        if fp is not None and fp != fingerprint:
            refuse(f"MLflow parent run {run_id}", fp)
    if optuna_storage:
        import optuna

        from sweeps.search.searcher import FINGERPRINT_ATTR

        try:
            summaries = optuna.study.get_all_study_summaries(optuna_storage, include_best_trial=False)
        except Exception:  # noqa: BLE001 - unreadable storage: the searcher reports it when it opens it
            summaries = []
        for st in summaries:
            fp = (st.user_attrs or {}).get(FINGERPRINT_ATTR)
            if st.study_name.startswith(f"{sweep_id}-B") and fp not in (None, fingerprint):
                refuse(f"Optuna study {st.study_name}", fp)


#: the lock a running driver holds on its output folder (``flock``; released when the process ends)
LOCK_FILE = ".critbatch.lock"


def _holder(output: Path) -> str:
    """Who holds an output folder, for error messages: its sweep id and the driver's pid and host."""
    who = {}
    for path, read in (
        (output / LOCK_FILE, lambda p: json.loads(p.read_text() or "{}")),
        (output / "sweep.json", read_sweep_json),
    ):
        try:
            who = {**read(path), **who}
        except (OSError, ValueError):  # a newer critbatch's sweep.json (InvalidInput) as well
            continue
    sweep = who.get("sweep_id", "?")
    where = f" (pid {who['pid']} on {who.get('host', '?')})" if who.get("pid") else ""
    return f"sweep '{sweep}'{where}"


def _lock(output: Path) -> int | None:
    """Take the folder's exclusive lock without waiting; the fd, or None when another process holds it."""
    import fcntl

    path = output / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return None
            raise
        try:  # the holder before us may have removed the file after we opened it: lock the one on disk
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


@dataclass
class OutputClaim:
    """An output folder claimed by this process: its lock is held until :meth:`release`.

    Attributes:
        output: the folder.
        created: the folders the claim created (to remove if the sweep never starts), outermost first.
    """

    output: Path
    created: list[Path] = field(default_factory=list)
    fd: int | None = None

    def _write_holder(self, sweep_id: str) -> None:
        assert self.fd is not None  # the lock is held: the claim opened it
        data = json.dumps({"sweep_id": sweep_id, "pid": os.getpid(), "host": socket.gethostname()}).encode()
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def release(self, *, remove: bool = False) -> None:
        """Give the folder up; ``remove``: the sweep never started, so remove what the claim made
        (``sweep.json``, the lock, and every folder it created if empty)."""
        if self.fd is None:
            return
        if remove:
            for name in ("sweep.json", "sweep.json.tmp"):
                (self.output / name).unlink(missing_ok=True)
        (self.output / LOCK_FILE).unlink(missing_ok=True)
        os.close(self.fd)  # releases the flock
        self.fd = None
        if remove:
            for d in reversed(self.created):
                try:
                    d.rmdir()
                except OSError:
                    break


def claim_output_folder(output: Path, sweep_id: str, fingerprint: str) -> OutputClaim:
    """Claim a new sweep's output folder atomically, before anything starts.

    Creates the folder (and missing parents), takes its exclusive lock (:data:`LOCK_FILE`) and
    creates ``sweep.json`` exclusively (status ``STARTING``). Two runs into one folder started at
    once: exactly one claims it. A ``STARTING`` claim whose driver died (its lock is free) is taken over.

    Raises:
        InvalidInput: the folder cannot be created, another driver holds it, or it holds another
            sweep (the message names it).
    """
    output = Path(output)
    created = [p for p in [*reversed(output.parents), output] if not p.exists()]
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        for d in reversed(created):
            try:
                d.rmdir()
            except OSError:
                pass
        raise InvalidInput(f"--output {output}: cannot create the folder: {exc.strerror or exc}") from None
    if not output.is_dir():
        raise InvalidInput(f"--output {output} exists and is not a folder")
    claim = OutputClaim(output=output, created=created)
    claim.fd = _lock(output)
    if claim.fd is None:
        raise InvalidInput(f"--output {output} is in use by {_holder(output)}: choose another folder")
    marker = output / "sweep.json"
    try:
        if marker.is_file():
            try:
                old = read_sweep_json(marker)
            except InvalidInput:  # written by a newer critbatch
                raise
            except (OSError, ValueError):
                old = {}
            if old.get("status") != SweepStatus.STARTING:  # a STARTING claim whose driver died is taken over
                raise InvalidInput(
                    f"--output {output} already holds sweep '{old.get('sweep_id', '?')}': use `critbatch resume "
                    f"{output}` to continue it, or choose another folder"
                )
            marker.unlink()
        claim._write_holder(sweep_id)
        tmp = output / f".sweep.json.{os.getpid()}"
        write_json(
            tmp,
            {
                VERSION_KEY: SWEEP_JSON_VERSION,
                "sweep_id": sweep_id,
                "fingerprint": fingerprint,
                "status": SweepStatus.STARTING,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "created": time.time(),
            },
            indent=None,
        )
        try:
            os.link(tmp, marker)  # exclusive and atomic: fails if sweep.json appeared meanwhile
        except FileExistsError:
            raise InvalidInput(f"--output {output} already holds {_holder(output)}: choose another folder") from None
        finally:
            tmp.unlink(missing_ok=True)
    except BaseException:
        claim.release(remove=not marker.is_file() or _own_marker(marker))
        raise
    return claim


def _own_marker(marker: Path) -> bool:
    try:
        return read_sweep_json(marker).get("pid") == os.getpid()
    except (OSError, ValueError):
        return False


def lock_output_folder(output: Path, sweep_id: str) -> OutputClaim:
    """Take the lock of an existing sweep's output folder (``critbatch resume``).

    Raises:
        InvalidInput: another driver (a run or a resume) holds it.
    """
    claim = OutputClaim(output=Path(output))
    claim.fd = _lock(claim.output)
    if claim.fd is None:
        raise InvalidInput(f"{output}: {_holder(claim.output)} is running there: stop it before resuming")
    claim._write_holder(sweep_id)
    return claim
