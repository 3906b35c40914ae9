"""The pieces of ``critbatch prepare-data`` that run per input unit: finding the inputs, reading their
documents (``pyarrow`` for JSON Lines and Parquet), tokenizing a batch of documents, writing a shard.

A *unit* is what one process tokenizes into one train and one validation shard: a text file, a
JSON Lines file, or one Parquet row group. Internal to :mod:`workloads.data.prepare`.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import itertools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from workloads.errors import DataError

__all__ = ["Unit", "expand_inputs", "input_format", "list_units", "count_documents", "tokenize_unit"]

#: documents per tokenizer call
BATCH_DOCUMENTS = 512


@dataclass(frozen=True)
class Unit:
    """One piece of input: ``path`` and, for Parquet, its ``row_group`` (-1: the whole file)."""

    path: str
    row_group: int = -1
    weight_bytes: int = 0  # for the progress bar


def input_format(path: str) -> str:
    """``jsonl`` (``.jsonl``, ``.json``, ``.ndjson``), ``parquet`` (``.parquet``) or ``text`` (anything else)."""
    suffix = Path(path).suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        return "jsonl"
    return "parquet" if suffix == ".parquet" else "text"


def expand_inputs(patterns: list[str]) -> tuple[list[str], str]:
    """The input files (sorted, unique, absolute) matched by ``patterns`` (globs, ``**`` recursive), and their format.

    Raises:
        DataError: a pattern matching no file, an empty file, or inputs of more than one format.
    """
    files: list[str] = []
    for pat in patterns:
        hits = sorted(p for p in glob.glob(os.path.expanduser(pat), recursive=True) if os.path.isfile(p))
        if not hits:
            raise DataError(f"input {pat!r} matches no file")
        files += [str(Path(p).resolve()) for p in hits]
    files = sorted(dict.fromkeys(files))
    empty = [f for f in files if os.path.getsize(f) == 0]
    if empty:
        raise DataError(f"input {empty[0]} is empty")
    formats = {input_format(f) for f in files}
    if len(formats) > 1:
        raise DataError(f"inputs mix formats {sorted(formats)}: give one kind of file (text, JSON Lines or Parquet)")
    return files, formats.pop()


def list_units(files: list[str], fmt: str) -> list[Unit]:
    """The units of ``files``: one per file, one per row group for Parquet.

    Raises:
        DataError: a file Parquet cannot read.
    """
    if fmt != "parquet":
        return [Unit(path=f, weight_bytes=os.path.getsize(f)) for f in files]
    import pyarrow.parquet as pq

    units = []
    for f in files:
        try:
            meta = pq.ParquetFile(f).metadata
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid and OSError
            raise DataError(f"{f} is not a Parquet file: {exc}") from None
        units += [Unit(path=f, row_group=i, weight_bytes=meta.row_group(i).total_byte_size)
                  for i in range(meta.num_row_groups)]
    return units


def _column(table, column: str, where: str) -> list[str]:
    if column not in table.column_names:
        raise DataError(f"{where} has no column {column!r} (columns: {table.column_names}); set --text-column")
    col = table.column(column)
    import pyarrow as pa

    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise DataError(f"{where}: column {column!r} holds {col.type}, not text")
    return [s if s is not None else "" for s in col.to_pylist()]


def read_documents(unit: Unit, fmt: str, *, text_column: str, text_documents: str) -> list[str]:
    """The documents of ``unit``, in order.

    Args:
        text_documents: for text files, ``file`` (a file is one document), ``paragraph``
            (documents are separated by blank lines) or ``line`` (every line that is not blank is a
            document, without its line ending: ``\n`` or ``\r\n``).

    Raises:
        DataError: a text file that is not UTF-8, a JSON Lines or Parquet file that does not parse
            or lacks the text column.
    """
    if fmt == "text":
        try:
            text = Path(unit.path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{unit.path} is not UTF-8 text: {exc}") from None
        if text_documents == "file":
            return [text]
        if text_documents == "line":
            return [x for x in re.split(r"\r?\n", text) if x.strip()]
        return [p for p in re.split(r"\n[ \t]*\n", text) if p.strip()]
    if fmt == "jsonl":
        import pyarrow.json as pj

        try:
            table = pj.read_json(unit.path)
        except Exception as exc:  # noqa: BLE001 - pyarrow.lib.ArrowInvalid names the line
            raise DataError(f"{unit.path} is not JSON Lines: {exc}") from None
        return _column(table, text_column, unit.path)
    import pyarrow.parquet as pq

    table = pq.ParquetFile(unit.path).read_row_group(unit.row_group)
    return _column(table, text_column, f"{unit.path} (row group {unit.row_group})")


def count_documents(unit: Unit, fmt: str, text_column: str, text_documents: str) -> int:
    """Documents in ``unit`` (Parquet from its metadata, text files in ``file`` mode without reading)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(unit.path).metadata.row_group(unit.row_group).num_rows
    if fmt == "text" and text_documents == "file":
        return 1
    return len(read_documents(unit, fmt, text_column=text_column, text_documents=text_documents))


@functools.lru_cache(maxsize=2)
def _backend(tokenizer_json: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(tokenizer_json)


def encode_documents(docs: list[str], tokenizer_json: str | None, separator: tuple[int, ...]) -> np.ndarray:
    """Token ids of ``docs`` concatenated, ``separator`` after each document, as a 1-D integer array
    (``uint8`` for the byte tokenizer, else int64).

    Args:
        tokenizer_json: a fast tokenizer's backend (``tokenizers.Tokenizer.to_str()``), batch-encoded
            without special tokens; None for the byte tokenizer (UTF-8 bytes).
    """
    if tokenizer_json is None:  # bytes stay uint8 until the shard's dtype
        sep = bytes(separator)
        return np.frombuffer(b"".join(d.encode("utf-8") + sep for d in docs), dtype=np.uint8)
    tok = _backend(tokenizer_json)
    encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
    ids = [e.ids for e in encode(docs, add_special_tokens=False)]
    total = sum(len(x) for x in ids) + len(separator) * len(ids)
    flat = itertools.chain.from_iterable(itertools.chain(x, separator) for x in ids)
    return np.fromiter(flat, dtype=np.int64, count=total)


class _ShardWriter:
    """Appends token arrays to one shard file, counting tokens and documents, hashing as it writes."""

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = path, dtype
        self.file = open(path, "wb")  # noqa: SIM115 - written by every write(), closed by close()
        self.sha = hashlib.sha256()
        self.tokens = self.documents = self.max_id = 0

    def write(self, ids: np.ndarray, documents: int) -> None:
        if len(ids):
            data = ids.astype(self.dtype).tobytes()
            self.file.write(data)
            self.sha.update(data)
            self.max_id = max(self.max_id, int(ids.max()))
        self.tokens += len(ids)
        self.documents += documents

    def close(self, split: str) -> dict[str, Any]:
        self.file.close()
        return {"file": self.path.name, "split": split, "tokens": self.tokens, "documents": self.documents,
                "max_token_id": self.max_id, "sha256": self.sha.hexdigest()}


def _batches(docs: list[str], val_local: set[int]) -> Iterator[tuple[list[str], list[str]]]:
    for lo in range(0, len(docs), BATCH_DOCUMENTS):
        idx = range(lo, min(lo + BATCH_DOCUMENTS, len(docs)))
        yield [docs[i] for i in idx if i not in val_local], [docs[i] for i in idx if i in val_local]


def tokenize_unit(job: dict[str, Any]) -> list[dict[str, Any]]:
    """Tokenize one unit into ``train-NNNNN.bin`` and ``validation-NNNNN.bin`` in ``job["folder"]``
    (the process-pool task of :func:`workloads.data.prepare.prepare_data`).

    ``job``: ``unit``, ``fmt``, ``number`` (the unit's place), ``folder``, ``dtype``, ``validation``
    (the unit's validation documents, local indices), ``tokenizer_json``, ``separator``,
    ``text_column``, ``text_documents``.

    Returns:
        the two shard entries of the index (train first), with tokens, documents, largest id and sha256.
    """
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one process per core already
    docs = read_documents(job["unit"], job["fmt"], text_column=job["text_column"], text_documents=job["text_documents"])
    folder, dtype, n = Path(job["folder"]), np.dtype(job["dtype"]), job["number"]
    writers = {s: _ShardWriter(folder / f"{s}-{n:05d}.bin", dtype) for s in ("train", "validation")}
    for train, val in _batches(docs, set(job["validation"])):
        for split, part in (("train", train), ("validation", val)):
            if part:
                writers[split].write(encode_documents(part, job["tokenizer_json"], tuple(job["separator"])), len(part))
    return [writers[s].close(s) for s in ("train", "validation")]
