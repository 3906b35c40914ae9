"""The inputs that shape a sweep's result, pinned by content when it starts and checked on resume.

A resume after the corpus changed used to re-prepare ``OUT/data`` from the new file and end
SUCCEEDED with some batch sizes trained on one corpus and some on another under one ``cbs.json``
(issue 30). ``sweep.json`` now records, for every local input, its path and a SHA-256 of its
content; ``critbatch resume`` recomputes them and refuses (exit 2) when one differs.

Pinned: ``data.path`` (a file, or every file under a folder), ``data.shards`` (its ``index.json``,
which records each shard's SHA-256), ``data.tokenizer`` (the folder's files; ``byte`` needs none)
and ``finetune.checkpoint_dir`` (every file of the checkpoint). The shard files themselves
(``data.shards files``) are pinned by size and modification time against the SHA-256 their index
records: a shard rewritten under an unchanged index (same size or not) is hashed on resume and
refused if it no longer matches, without hashing gigabytes of unchanged shards at every start.
The model's ``hf_config`` (a path is read once, when the sweep starts, into ``OUT/spec.yaml``, which
the resume reads) and every other setting are in the spec, whose fingerprint the sweep id is already
bound to. Remote inputs (``s3://...``) are recorded as not pinned: their content is not read here.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from sweeps.errors import InvalidInput
from sweeps.spec import SweepSpec

__all__ = ["pin_inputs", "check_inputs_unchanged", "content_sha256"]


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


def _inputs(spec: SweepSpec) -> dict[str, str]:
    """``{spec field: local path or URI}`` of the inputs that shape the result."""
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


def pin_inputs(spec: SweepSpec) -> dict[str, dict[str, Any]]:
    """``{field: {"path", "sha256"}}`` for each input of ``spec`` (paths as resolved by
    ``sweeps.run.preflight.resolve_paths``); a remote input gets ``"sha256": None`` (not pinned).
    Local shards add ``"data.shards files"``: ``{"path": folder, "sha256": None, "files": {name: {"bytes",
    "mtime_ns", "sha256" (the index's)}}}``.

    Raises:
        FileNotFoundError: a local input vanished since the preflight checks.
    """
    got = {field: {"path": where, "sha256": None if "://" in where else content_sha256(Path(where))}
           for field, where in _inputs(spec).items()}
    if spec.data.shards is not None and "://" not in spec.data.shards:
        got[SHARD_FILES] = _pin_shard_files(Path(spec.data.shards))
    return got


#: the ``sweep.json`` ``inputs`` key of the shard files of a local ``data.shards``
SHARD_FILES = "data.shards files"


def _pin_shard_files(folder: Path) -> dict[str, Any]:
    """Each shard its index lists: its size and modification time now, and the SHA-256 its index records."""
    index = json.loads((folder / "index.json").read_text())
    files = {}
    for entry in index.get("shards") or []:
        st = (folder / entry["file"]).stat()
        files[entry["file"]] = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": entry.get("sha256")}
    return {"path": str(folder), "sha256": None, "files": files}


def _check_shard_files(rec: dict[str, Any], output: Path) -> None:
    """Refuse when a pinned shard is gone, or changed (size or mtime) and no longer matches its index's SHA-256."""
    for name, was in (rec.get("files") or {}).items():
        f = Path(rec["path"]) / name
        try:
            st = f.stat()
        except FileNotFoundError:
            raise InvalidInput(f"data.shards {f} is gone since the sweep in {output} started: put it back to resume, "
                               "or start a new sweep") from None
        if (st.st_size, st.st_mtime_ns) == (was["bytes"], was["mtime_ns"]):
            continue
        now = content_sha256(f)
        if was.get("sha256") is not None and now != was["sha256"]:
            raise InvalidInput(
                f"data.shards {f} changed since the sweep in {output} started (sha256 {was['sha256']} in its index, {now} "
                "now): a resume would train its remaining trials on other data; put the original back, or start a new sweep")


def check_inputs_unchanged(pinned: dict[str, dict[str, Any]] | None, output: Path) -> None:
    """Refuse a resume whose inputs are not the ones its sweep started with.

    Args:
        pinned: ``sweep.json``'s ``inputs`` (None: a sweep started before inputs were pinned; not checked).
        output: the sweep's folder, for the message.

    Raises:
        InvalidInput: an input is gone or its content changed, naming the field, the path and both hashes.
    """
    for field, rec in (pinned or {}).items():
        if field == SHARD_FILES:
            continue  # after the index (below): a changed index says more than a changed shard
        if rec.get("sha256") is None:
            continue
        path = Path(rec["path"])
        try:
            now = content_sha256(path)
        except FileNotFoundError:
            raise InvalidInput(f"{field} {path} is gone since the sweep in {output} started (it was sha256 "
                               f"{rec['sha256']}): put it back to resume, or start a new sweep") from None
        if now != rec["sha256"]:
            raise InvalidInput(
                f"{field} {path} changed since the sweep in {output} started (sha256 {rec['sha256']} then, {now} now): "
                "a resume would train its remaining trials on other data; put the original back, or start a new sweep")
    if SHARD_FILES in (pinned or {}):
        _check_shard_files(pinned[SHARD_FILES], output)
