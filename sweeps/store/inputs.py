"""The inputs that shape a sweep's result, pinned by content when it starts, and the one gate every way
back into a started sweep goes through.

A resume after the corpus changed used to re-prepare ``OUT/data`` from the new file and end
SUCCEEDED with some batch sizes trained on one corpus and some on another under one ``cbs.json``;
a retried job (same ``--sweep-id`` and ``resources.storage_path``, a new ``--output``) mixed
two tokenizers and two models the same way, since the sweep id is bound to the spec's fingerprint, which
holds the inputs' paths, not their contents. So every local input is pinned by a SHA-256 of its content
when the sweep starts (:func:`pin_inputs`), in ``OUT/sweep.json`` and, with shared storage, beside Tune's
state in ``ROOT/critbatch-sweep.json`` (``sweeps.store.claims``); every way back recomputes them from the
spec it would run and refuses (exit 2) naming each input that differs and both hashes
(:func:`check_inputs_unchanged`): ``critbatch resume`` against ``sweep.json``, a ``critbatch run --sweep-id``
whose storage root holds the sweep (a retried job, the REST service's jobs, the KubeRay entrypoint) against
the storage root's record. Paths do not count: the same content at another path (a job's new working
directory) is the same input.

Pinned: ``data.path`` (a file, or every file under a folder), ``data.shards`` (its ``index.json``,
which records each shard's SHA-256), ``data.tokenizer`` (the folder's files; ``byte`` needs none),
``model.hf_config`` (the mapping the workers build the model from, as canonical JSON: a path is read once,
when the sweep starts, into ``OUT/spec.yaml``, which a resume reads) and ``finetune.checkpoint_dir`` (every
file of the checkpoint). The shard files themselves (``data.shards files``) are pinned by size and
modification time against the SHA-256 their index records: a shard rewritten under an unchanged index
(same size or not) is hashed and refused if it no longer matches, without hashing gigabytes of unchanged
shards at every start. Every other setting is in the spec, whose fingerprint the sweep id is bound to.
Remote inputs (``s3://...``) are recorded as not pinned: their content is not read here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput
from sweeps.spec import SweepSpec

__all__ = ["HF_CONFIG", "SHARD_FILES", "check_inputs_unchanged", "content_sha256", "pin_inputs"]

#: the ``inputs`` key of the shard files of a local ``data.shards``
SHARD_FILES = "data.shards files"
#: the ``inputs`` key of the model's ``hf_config``
HF_CONFIG = "model.hf_config"


def content_sha256(path: Path) -> str:
    """The hex SHA-256 of a file's bytes, or of a folder's files (relative names and bytes, sorted).

    Raises:
        FileNotFoundError: ``path`` does not exist.
    """
    from workloads.api import file_sha256

    if path.is_file():
        return file_sha256(path)
    if not path.is_dir():
        raise FileNotFoundError(str(path))
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0")
        h.update(bytes.fromhex(file_sha256(f)))
    return h.hexdigest()


def _mapping_sha256(mapping: dict[str, Any]) -> str:
    """The hex SHA-256 of a JSON mapping's canonical form (sorted keys, no spaces): its content, not its layout."""
    return hashlib.sha256(json.dumps(mapping, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _inputs(spec: SweepSpec) -> dict[str, str]:
    """``{spec field: local path or URI}`` of the file inputs that shape the result."""
    got: dict[str, str] = {}
    if spec.data.path is not None:
        got["data.path"] = spec.data.path
    if spec.data.shards is not None:
        shards = spec.data.shards
        got["data.shards"] = shards if "://" in shards else str(Path(shards) / "index.json")
    if spec.data.tokenizer != "byte":
        got["data.tokenizer"] = spec.data.tokenizer
    if spec.finetune is not None:
        got["finetune.checkpoint_dir"] = spec.finetune.checkpoint_dir
    return got


def pin_inputs(
    spec: SweepSpec, *, hf_config_from: str | None = None, missing_ok: bool = False
) -> dict[str, dict[str, Any]]:
    """``{field: {"path", "sha256"}}`` for each input of ``spec`` (resolved: ``sweeps.run.preflight.resolve_paths``,
    so ``model.hf_config`` is a mapping); a remote input gets ``"sha256": None`` (not pinned). Local shards add
    :data:`SHARD_FILES`: ``{"path": folder, "sha256": None, "files": {name: {"bytes", "mtime_ns", "sha256" (the
    index's)}}}``.

    Args:
        spec: the resolved spec.
        hf_config_from: where ``model.hf_config`` was read from, for messages (default ``"inline"``).
        missing_ok: a local input (or shard) that does not exist is recorded as ``{"path", "sha256": None,
            "missing": True}`` instead of raising (what :func:`check_inputs_unchanged` is given).

    Raises:
        FileNotFoundError: a local input vanished since the preflight checks (unless ``missing_ok``).
    """
    got: dict[str, dict[str, Any]] = {}
    for field, where in _inputs(spec).items():
        try:
            got[field] = {"path": where, "sha256": None if "://" in where else content_sha256(Path(where))}
        except FileNotFoundError:
            if not missing_ok:
                raise
            got[field] = {"path": where, "sha256": None, "missing": True}
    if spec.model.hf_config is not None:
        hf = spec.model.hf_config
        if not isinstance(hf, dict):
            raise ValueError("pin_inputs needs the resolved spec (model.hf_config read into a mapping)")
        got[HF_CONFIG] = {"path": hf_config_from or "inline", "sha256": _mapping_sha256(hf)}
    if spec.data.shards is not None and "://" not in spec.data.shards and "missing" not in got["data.shards"]:
        got[SHARD_FILES] = _pin_shard_files(Path(spec.data.shards), missing_ok=missing_ok)
    return got


def _pin_shard_files(folder: Path, *, missing_ok: bool) -> dict[str, Any]:
    """Each shard its index lists: its size and modification time now, and the SHA-256 its index records."""
    index = json.loads((folder / "index.json").read_text())
    files: dict[str, Any] = {}
    for entry in index.get("shards") or []:
        try:
            st = (folder / entry["file"]).stat()
        except FileNotFoundError:
            if not missing_ok:
                raise
            files[entry["file"]] = {"missing": True, "sha256": entry.get("sha256")}
            continue
        files[entry["file"]] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": entry.get("sha256")}
    return {"path": str(folder), "sha256": None, "files": files}


def check_inputs_unchanged(
    pinned: dict[str, dict[str, Any]] | None,
    now: dict[str, dict[str, Any]],
    *,
    since: str,
    remedy: str = "put the originals back to resume, or start a new sweep",
) -> None:
    """The gate of every way back into a started sweep: refuse when an input it was pinned with differs now.

    Contents are compared, not paths: ``now``'s paths may differ (a retried job's new working directory).
    Only the inputs ``pinned`` holds are checked (one added since, e.g. ``model.hf_config`` in a sweep pinned
    before it was, is not); the shard files only when the index itself is unchanged (a changed index says more).

    Args:
        pinned: the inputs the sweep started with (``sweep.json``'s or the storage root's; None: a sweep
            started before inputs were pinned, not checked).
        now: :func:`pin_inputs` (``missing_ok=True``) of the spec the way back would run.
        since: what the hashes date from, for the message ("the sweep in OUT started").
        remedy: what to do instead, for the message.

    Raises:
        InvalidInput: one line naming every input that changed or is gone, its path and both hashes.
    """
    changed: list[str] = []
    for field, rec in (pinned or {}).items():
        if field == SHARD_FILES or rec.get("sha256") is None:
            continue
        cur = now.get(field)
        if cur is None:
            changed.append(f"{field} is no longer given (it was {rec['path']}, sha256 {rec['sha256']})")
        elif cur.get("missing"):
            changed.append(f"{field} {cur['path']} is gone since {since} (it was sha256 {rec['sha256']})")
        elif cur.get("sha256") is None:
            changed.append(
                f"{field} is now {cur['path']}, whose content is not read here (it was {rec['path']}, "
                f"sha256 {rec['sha256']})"
            )
        elif cur["sha256"] != rec["sha256"]:
            changed.append(
                f"{field} {cur['path']} changed since {since} (sha256 {rec['sha256']} then, {cur['sha256']} now)"
            )
    if pinned and SHARD_FILES in pinned and not any(c.startswith("data.shards ") for c in changed):
        changed += _changed_shard_files(pinned[SHARD_FILES], now.get(SHARD_FILES), since)
    if changed:
        raise InvalidInput(
            "; ".join(changed) + f": the remaining trials would train on other inputs than the finished "
            f"ones, under one result; {remedy}"
        )


def _changed_shard_files(was: dict[str, Any], now: dict[str, Any] | None, since: str) -> list[str]:
    """The pinned shards that are gone, or changed (size, mtime or folder) and no longer match their index's SHA-256."""
    folder = Path((now or was)["path"])
    now_files = (now or {}).get("files") or {}
    changed = []
    for name, rec in (was.get("files") or {}).items():
        f, cur = folder / name, now_files.get(name)
        if cur is None or cur.get("missing"):
            changed.append(f"data.shards {f} is gone since {since}")
            continue
        if str(folder) == was["path"] and (cur["bytes"], cur["mtime_ns"]) == (rec["bytes"], rec["mtime_ns"]):
            continue
        digest = content_sha256(f)
        if rec.get("sha256") is not None and digest != rec["sha256"]:
            changed.append(f"data.shards {f} changed since {since} (sha256 {rec['sha256']} in its index, {digest} now)")
    return changed
