"""Tokenize a corpus once into memory-mappable token shards (``critbatch prepare-data``).

Inputs are text files (globs), JSON Lines or Parquet with a text column (read with ``pyarrow``);
the tokenizer is ``byte`` or a local Hugging Face fast tokenizer, batch-encoded without special
tokens, each document followed by the tokenizer's EOS (the byte tokenizer, which has none, by a
newline byte). Units (a file, a Parquet row group) are tokenized in parallel processes, each into one
train and one validation shard. The held-out split is by documents: ``round(fraction * documents)``
of them (at least one) drawn without replacement by ``numpy.random.default_rng(seed)``, the same
for any number of processes. Everything is written into a temporary sibling folder renamed into
place at the end, so a failure leaves nothing half-written; a folder whose index already has
the same inputs hash and whose shards match their checksums is left as it is.

The index format is described in :mod:`workloads.data.shards`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import numbers
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from workloads.data._prepare_io import Unit, count_documents, expand_inputs, list_units, tokenize_unit
from workloads.errors import DataError
from workloads.data.shards import FORMAT, INDEX_FILE, dtype_for_vocab, file_sha256, read_index

__all__ = ["PrepareResult", "prepare_data", "prepare_text_file", "tokenizer_identity"]

#: the byte tokenizer's identity (its ids are the UTF-8 bytes; no files to hash)
_BYTE_IDENTITY = hashlib.sha256(b"critbatch byte tokenizer: id = UTF-8 byte, 256 ids, no special tokens").hexdigest()


@dataclass(frozen=True)
class PrepareResult:
    """What :func:`prepare_data` did: the folder, its index (the JSON object), and whether it was
    already up to date (nothing written)."""

    folder: str
    index: dict[str, Any]
    up_to_date: bool


def tokenizer_identity(tokenizer: str) -> dict[str, Any]:
    """The tokenizer's identity as the index records it.

    Returns:
        ``{"name", "sha256", "vocab_size", "eos_token_id", "separator"}``: ``sha256`` over the
        folder's files (names and bytes, sorted), or a fixed hash for ``byte``; ``separator`` the
        ids appended after each document (``[eos]``, ``[10]`` for ``byte``, ``[]`` without an EOS).

    Raises:
        DataError: not ``byte`` and not a folder with a fast tokenizer.
    """
    if tokenizer == "byte":
        return {"name": "byte", "sha256": _BYTE_IDENTITY, "vocab_size": 256, "eos_token_id": None, "separator": [10]}
    folder = Path(tokenizer)
    try:
        tok = _load(tokenizer)
    except Exception as exc:  # noqa: BLE001 - transformers raises anything from OSError to ValueError
        raise DataError(f"tokenizer {tokenizer}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    if not getattr(tok, "is_fast", False):
        raise DataError(f"tokenizer {tokenizer} is not a fast (Rust) tokenizer; save one with tokenizer.json")
    h = hashlib.sha256()
    for f in sorted(p for p in folder.iterdir() if p.is_file()):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    eos = tok.eos_token_id
    if eos is not None and not isinstance(eos, numbers.Integral):
        raise DataError(f"tokenizer {tokenizer}: its eos_token_id {eos!r} is not one token id")
    return {"name": str(folder.resolve()), "sha256": h.hexdigest(), "vocab_size": len(tok),
            "eos_token_id": None if eos is None else int(eos), "separator": [] if eos is None else [int(eos)]}


def _backend_json(tokenizer: str) -> str | None:
    if tokenizer == "byte":
        return None
    return _load(tokenizer).backend_tokenizer.to_str()


@functools.lru_cache(maxsize=2)
def _load(tokenizer: str):
    """The Hugging Face tokenizer in folder ``tokenizer`` (loaded once: importing transformers is slow)."""
    from workloads.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer)


def _validation_documents(counts: list[int], fraction: float, seed: int) -> list[list[int]]:
    """Per unit, the local indices of its held-out documents (see the module docstring).

    Raises:
        DataError: fewer than two documents (nothing to hold out from).
    """
    total = sum(counts)
    if total < 2:
        raise DataError(f"the inputs hold {total} document(s); a held-out split by documents needs at least 2")
    n_val = min(total - 1, max(1, round(fraction * total)))
    chosen = np.sort(np.random.default_rng(seed).choice(total, size=n_val, replace=False))
    starts = np.cumsum([0] + counts)
    return [(chosen[(chosen >= lo) & (chosen < hi)] - lo).tolist() for lo, hi in itertools.pairwise(starts)]


def _up_to_date(folder: Path, inputs_sha256: str) -> dict[str, Any] | None:
    """The index of ``folder`` if it was made from the same inputs and every shard matches its sha256."""
    try:
        index = read_index(str(folder))
    except DataError:
        return None
    if index.raw.get("inputs_sha256") != inputs_sha256:
        return None
    if any(file_sha256(folder / s["file"]) != s["sha256"] for s in index.raw["shards"]):
        return None
    return index.raw


def _inputs_sha256(files: list[str], options: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    inputs = [{"path": f, "bytes": os.path.getsize(f), "sha256": file_sha256(f)} for f in files]
    blob = json.dumps({"format": FORMAT, "inputs": [i["sha256"] for i in inputs], **options}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest(), inputs


def _install(tmp: Path, output: Path, index: dict[str, Any]) -> None:
    """Write the index into ``tmp`` and move ``tmp`` to ``output`` (an older prepared folder replaced)."""
    (tmp / INDEX_FILE).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp made it private; readers on other nodes need it
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        output.rename(old)
        tmp.rename(output)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(output)


def _make_parents(output: Path) -> Path | None:
    """Create ``output``'s missing parent folders; the topmost one created (None: none was)."""
    missing = [p for p in output.parents if not p.exists()]
    output.parent.mkdir(parents=True, exist_ok=True)
    return missing[-1] if missing else None


def _check_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or (any(output.iterdir()) and not (output / INDEX_FILE).is_file())):
        raise DataError(f"output {output} exists and is not a prepared-data folder (no {INDEX_FILE}); "
                        "choose a new or empty folder")


def _index(identity, dtype, split, inputs_sha256, inputs, fmt, text_column, shards) -> dict[str, Any]:
    totals = {s: {"tokens": sum(x["tokens"] for x in shards if x["split"] == s),
                  "documents": sum(x["documents"] for x in shards if x["split"] == s),
                  "shards": sum(1 for x in shards if x["split"] == s)} for s in ("train", "validation")}
    return {"format": FORMAT, "tokenizer": identity, "vocab_size": identity["vocab_size"], "dtype": dtype.name,
            "split": split, "inputs_sha256": inputs_sha256, "inputs": inputs, "input_format": fmt,
            "text_column": text_column, "shards": shards, "totals": totals}


def prepare_data(inputs: list[str], output: str | Path, *, tokenizer: str = "byte", text_column: str = "text",
                 validation_fraction: float = 0.1, seed: int = 0, text_documents: str = "file",
                 num_proc: int | None = None, progress: Callable[[int, int], None] | None = None) -> PrepareResult:
    """Tokenize ``inputs`` into shards in ``output`` (see the module docstring).

    Args:
        inputs: file paths or globs, all text, all JSON Lines, or all Parquet.
        output: the prepared folder (created; an older prepared folder there is replaced).
        text_column: the text field of JSON Lines / Parquet rows.
        validation_fraction: held-out fraction of the documents, in (0, 0.5].
        seed: fixes which documents are held out.
        text_documents: text files only: ``file`` (one document per file), ``paragraph`` or ``line``.
        num_proc: tokenizing processes (default: the CPUs this process may use).
        progress: called as ``progress(done_bytes, total_bytes)`` before the first unit and after each.

    Returns:
        a :class:`PrepareResult`; ``up_to_date`` when nothing needed writing.

    Raises:
        DataError: missing, empty, unreadable or mixed inputs, a missing text column, too few
            documents, a bad tokenizer (or one without EOS), or an output folder that is not a prepared-data folder.
    """
    if not 0.0 < validation_fraction <= 0.5:
        raise DataError(f"validation fraction {validation_fraction} must lie in (0, 0.5]")
    if text_documents not in ("file", "paragraph", "line"):
        raise DataError(f"text documents {text_documents!r}: use 'file', 'paragraph' or 'line'")
    output = Path(output).expanduser().resolve()
    _check_output(output)
    files, fmt = expand_inputs(inputs)
    identity = tokenizer_identity(tokenizer)
    if not identity["separator"]:
        raise DataError(f"tokenizer {tokenizer} has no EOS token to separate documents (set its eos_token)")
    split = {"method": "documents", "seed": seed, "validation_fraction": validation_fraction}
    options = {"tokenizer_sha256": identity["sha256"], "split": split, "text_column": text_column,
               "text_documents": text_documents if fmt == "text" else None}
    key, input_entries = _inputs_sha256(files, options)
    if (done := _up_to_date(output, key)) is not None:
        return PrepareResult(folder=str(output), index=done, up_to_date=True)
    units = list_units(files, fmt)
    dtype = dtype_for_vocab(identity["vocab_size"])
    made = _make_parents(output)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        shards = _run_units(units, fmt, tmp, dtype, identity, tokenizer, text_column, text_documents,
                            validation_fraction, seed, num_proc or len(os.sched_getaffinity(0)), progress)
        for s in [s for s in shards if s["tokens"] == 0]:
            (tmp / s["file"]).unlink()
        shards = [s for s in shards if s["tokens"]]
        index = _index(identity, dtype, split, key, input_entries, fmt, None if fmt == "text" else text_column, shards)
        _install(tmp, output, index)
    except BaseException:
        shutil.rmtree(made or tmp, ignore_errors=True)
        raise
    return PrepareResult(folder=str(output), index=index, up_to_date=False)


def _completed(ex: ProcessPoolExecutor | None, fn: Callable, args: list[tuple]):
    """``(i, fn(*args[i]))`` for every ``i``: in the pool ``ex`` as they finish, or here in order."""
    if ex is None:
        yield from ((i, fn(*a)) for i, a in enumerate(args))
        return
    futures = {ex.submit(fn, *a): i for i, a in enumerate(args)}
    for fut in as_completed(futures):
        yield futures[fut], fut.result()


def _run_units(units: list[Unit], fmt, tmp, dtype, identity, tokenizer, text_column, text_documents,
               fraction, seed, num_proc, progress) -> list[dict[str, Any]]:
    """Count the units' documents, choose the held-out ones, tokenize every unit (in one pool of
    ``num_proc`` processes when more than one): the shard entries, train shards first, each split in
    unit order."""
    import multiprocessing

    parallel = num_proc > 1 and len(units) > 1
    ex = ProcessPoolExecutor(max_workers=min(num_proc, len(units)),
                             mp_context=multiprocessing.get_context("spawn")) if parallel else None
    try:
        cheap = fmt == "parquet" or (fmt == "text" and text_documents == "file")
        counts = [0] * len(units)
        for i, n in _completed(None if cheap else ex, count_documents,
                               [(u, fmt, text_column, text_documents) for u in units]):
            counts[i] = n
        held = _validation_documents(counts, fraction, seed)
        backend = _backend_json(tokenizer)
        jobs = [({"unit": u, "fmt": fmt, "number": i, "folder": str(tmp), "dtype": dtype.name, "validation": held[i],
                  "tokenizer_json": backend, "separator": identity["separator"], "text_column": text_column,
                  "text_documents": text_documents},) for i, u in enumerate(units)]
        total, done, results = sum(u.weight_bytes for u in units), 0, {}
        if progress:
            progress(0, total)
        for i, pair in _completed(ex, tokenize_unit, jobs):
            results[i] = pair
            done += units[i].weight_bytes
            if progress:
                progress(done, total)
    finally:
        if ex is not None:
            ex.shutdown(cancel_futures=True)
    ordered = [results[i] for i in range(len(units))]
    return [pair[0] for pair in ordered] + [pair[1] for pair in ordered]


def prepare_text_file(path: str | Path, output: str | Path, *, tokenizer: str = "byte",
                      validation_fraction: float = 0.1) -> PrepareResult:
    """Prepare one raw text file as the sweep driver does for ``data.path``: the whole file tokenized
    as one text (no separator), its last ``int(tokens * validation_fraction)`` tokens held out, so
    the shards hold exactly the token ids ``workloads.data.corpus.load_corpus`` gives (the same training
    draw as before shards existed). A no-op when ``output`` is already up to date.

    Raises:
        DataError: a missing, empty or non-UTF-8 file, or a bad tokenizer.
    """
    from workloads.data._prepare_io import _ShardWriter
    from workloads.data.corpus import encode_text

    output = Path(output).expanduser().resolve()
    _check_output(output)
    files, _ = expand_inputs([str(path)])
    identity = tokenizer_identity(tokenizer)
    split = {"method": "tail", "seed": None, "validation_fraction": validation_fraction}
    key, input_entries = _inputs_sha256(files, {"tokenizer_sha256": identity["sha256"], "split": split})
    if (done := _up_to_date(output, key)) is not None:
        return PrepareResult(folder=str(output), index=done, up_to_date=True)
    try:
        ids = encode_text(Path(files[0]).read_text(encoding="utf-8"), tokenizer)
    except UnicodeDecodeError as exc:
        raise DataError(f"corpus {path} is not UTF-8 text: {exc}") from None
    n_val = int(len(ids) * validation_fraction)
    dtype = dtype_for_vocab(identity["vocab_size"])
    made = _make_parents(output)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        shards = []
        for split_name, part in (("train", ids[: len(ids) - n_val]), ("validation", ids[len(ids) - n_val:])):
            w = _ShardWriter(tmp / f"{split_name}-00000.bin", dtype)
            w.write(part, 1 if split_name == "train" else 0)
            shards.append(w.close(split_name))
        _install(tmp, output, _index({**identity, "separator": []}, dtype, split, key, input_entries, "text", None, shards))
    except BaseException:
        shutil.rmtree(made or tmp, ignore_errors=True)
        raise
    return PrepareResult(folder=str(output), index=json.loads((output / INDEX_FILE).read_text()), up_to_date=False)
