"""Prepared token shards: the index file, its checks, and the memory-mapped token stream workers read.

A prepared corpus is a folder (or an fsspec URI) holding ``index.json`` and flat binary shards of
token ids, ``uint16`` when the vocabulary fits in 16 bits, else ``uint32`` (``numpy.memmap``-able,
native little-endian). Written by :mod:`workloads.data.prepare` (``critbatch prepare-data``). The index::

    {"format": "critbatch-shards/1",
     "tokenizer": {"name": "byte" | folder, "sha256": hash of its files, "vocab_size": V,
                   "eos_token_id": id | null, "separator": [ids appended after each document]},
     "vocab_size": V, "dtype": "uint16" | "uint32",
     "split": {"method": "documents" | "tail", "seed": s, "validation_fraction": f},
     "inputs_sha256": hash of the inputs and options (re-running on the same inputs is a no-op),
     "inputs": [{"path", "bytes", "sha256"}], "input_format": "text" | "jsonl" | "parquet", "text_column": c,
     "shards": [{"file", "split": "train" | "validation", "tokens", "documents", "max_token_id", "sha256"}],
     "totals": {"train": {"tokens", "documents", "shards"}, "validation": {...}}}

A split's stream is its shards concatenated in index order; a window may cross a document boundary
(documents are separated by the tokenizer's EOS) and a shard boundary.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workloads.errors import DataError

__all__ = ["INDEX_FILE", "FORMAT", "ShardIndex", "TokenStream", "read_index", "check_index", "open_split",
           "dtype_for_vocab", "file_sha256", "local_shards"]

INDEX_FILE = "index.json"
FORMAT = "critbatch-shards/1"
SPLITS = ("train", "validation")


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """``uint16`` when every id of a ``vocab_size`` vocabulary fits in 16 bits, else ``uint32``."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def file_sha256(path: str | Path, *, chunk_bytes: int = 1 << 22) -> str:
    """The hex SHA-256 of a file's bytes (read in ``chunk_bytes`` pieces)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk_bytes):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class ShardIndex:
    """A parsed ``index.json`` (:func:`read_index`); ``raw`` is the JSON object itself, ``root`` the
    local folder holding the shard files (None: a remote index only looked at)."""

    root: Path | None
    raw: dict[str, Any]

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.raw["dtype"])

    @property
    def vocab_size(self) -> int:
        return int(self.raw["vocab_size"])

    @property
    def tokenizer_sha256(self) -> str:
        return str(self.raw["tokenizer"]["sha256"])

    def shards(self, split: str) -> list[dict[str, Any]]:
        """The shard entries of ``split`` (``train`` or ``validation``), in stream order."""
        return [s for s in self.raw["shards"] if s["split"] == split]

    def tokens(self, split: str) -> int:
        """Tokens in ``split``'s stream."""
        return sum(int(s["tokens"]) for s in self.shards(split))


def _is_uri(location: str) -> bool:
    return "://" in location and not location.startswith("file://")


def read_index(location: str, *, fetch: bool = True) -> ShardIndex:
    """Read and check the form of a prepared corpus's index: a local folder, or an fsspec URI, fetched
    into the per-node cache by :func:`local_shards` (``fetch``), else only looked at through fsspec
    (its shard sizes; ``root`` is then None: nothing can be memory-mapped).

    Raises:
        DataError: no index, unreadable JSON, an unknown format or missing keys, a dtype other than
            the one the vocabulary needs, a shard file missing or of the wrong size.
    """
    if _is_uri(location) and not fetch:
        return _remote_index(location)
    root = local_shards(location) if _is_uri(location) else Path(location.removeprefix("file://"))
    path = root / INDEX_FILE
    if not path.is_file():
        raise DataError(f"no shard index {INDEX_FILE} in {location} (make one with `critbatch prepare-data`)")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"shard index {path} is not readable JSON: {exc}") from None
    index = _checked(raw, root, str(path))
    for s in raw["shards"]:
        f = root / s["file"]
        if not f.is_file():
            raise DataError(f"shard {f} listed in {path} is missing")
        _check_size(f, f.stat().st_size, s, index.dtype)
    return index


def _check_size(name, size: int, entry: dict[str, Any], dtype: np.dtype) -> None:
    expect = int(entry["tokens"]) * dtype.itemsize
    if size != expect:
        raise DataError(f"shard {name} holds {size} bytes, the index says {entry['tokens']} {dtype.name} "
                        f"tokens ({expect} bytes)")


def _remote_index(uri: str) -> ShardIndex:
    import fsspec

    try:
        fs, base = fsspec.core.url_to_fs(uri)
        raw = json.loads(fs.cat_file(f"{base.rstrip('/')}/{INDEX_FILE}"))
    except Exception as exc:  # noqa: BLE001 - fsspec backends raise their own errors
        raise DataError(f"cannot read the shard index {INDEX_FILE} at {uri}: {exc}") from None
    index = _checked(raw, None, f"{uri}/{INDEX_FILE}")
    for s in raw["shards"]:
        name = f"{base.rstrip('/')}/{s['file']}"
        if not fs.exists(name):
            raise DataError(f"shard {uri}/{s['file']} listed in the index is missing")
        _check_size(f"{uri}/{s['file']}", int(fs.size(name)), s, index.dtype)
    return index


def _checked(raw: Any, root: Path | None, path: str) -> ShardIndex:
    """``raw`` as a :class:`ShardIndex` once its format, keys and dtype are checked."""
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DataError(f"shard index {path}: format is {raw.get('format') if isinstance(raw, dict) else None!r}, "
                        f"expected {FORMAT!r}")
    missing = [k for k in ("tokenizer", "vocab_size", "dtype", "shards", "split") if k not in raw]
    if missing:
        raise DataError(f"shard index {path}: missing {missing}")
    index = ShardIndex(root=root, raw=raw)
    want = dtype_for_vocab(index.vocab_size)
    if raw["dtype"] not in ("uint16", "uint32") or index.dtype != want:
        raise DataError(f"shard index {path}: dtype {raw['dtype']!r} does not match a vocabulary of "
                        f"{index.vocab_size} (expected {want.name})")
    return index


def check_index(index: ShardIndex, *, tokenizer_sha256: str, tokenizer_name: str, model_vocab_size: int | None,
                min_tokens: int) -> None:
    """Check prepared shards against the spec that will train on them.

    Args:
        tokenizer_sha256: the hash of the spec's tokenizer (``workloads.data.prepare.tokenizer_identity``).
        tokenizer_name: the spec's tokenizer as written (named in the error).
        model_vocab_size: the model's embedding rows (None: taken from the tokenizer).
        min_tokens: tokens each split must hold (one window: ``context_length_tokens + 1``).

    Raises:
        DataError: prefixed ``data.tokenizer:`` (another tokenizer made the shards) or
            ``data.shards:`` (a vocabulary or token id larger than the model's, a split too short).
    """
    made_by = index.raw["tokenizer"]
    if made_by.get("sha256") != tokenizer_sha256:
        raise DataError(f"data.tokenizer: {tokenizer_name!r} (sha256 {tokenizer_sha256[:12]}) is not the tokenizer "
                        f"the shards were made with ({made_by.get('name')!r}, sha256 {str(made_by.get('sha256'))[:12]})")
    top = max([int(s.get("max_token_id", 0)) for s in index.raw["shards"]] or [0])
    if model_vocab_size is not None and (index.vocab_size > model_vocab_size or top >= model_vocab_size):
        raise DataError(f"data.shards: the shards' vocabulary ({index.vocab_size}, largest id {top}) is larger than "
                        f"the model's embedding ({model_vocab_size} rows)")
    for split in SPLITS:
        if index.tokens(split) < min_tokens:
            raise DataError(f"data.shards: the {split} split holds {index.tokens(split)} tokens, fewer than one "
                            f"window ({min_tokens})")


#: the span unmapped around a window once it is read (a huge page: the page cache may map file
#: pages in 2 MiB folios, and the disk's read-ahead fills them)
_RELEASE_BYTES = 2 << 20


class TokenStream:
    """A split's shards as one read-only 1-D token sequence (one memory map per shard, nothing loaded).

    ``len(stream)`` is its token count; :meth:`gather` reads windows. Pages are read on demand and
    unmapped from the process once copied (``madvise(MADV_DONTNEED)``: they stay in the page cache),
    so a worker's resident memory does not grow with the corpus or with the steps it has drawn (the
    kernel maps whole read-ahead folios, ~2 MiB a window, when the pages are only touched).

    Args:
        arrays: 1-D token arrays in stream order (``numpy.ndarray`` or views of a memory map).
        maps: the ``mmap.mmap`` behind each array (None where there is none), released after reads.
    """

    def __init__(self, arrays: list[np.ndarray], maps: list | None = None):
        keep = [i for i, a in enumerate(arrays) if len(a)]
        self._arrays = [arrays[i] for i in keep]
        self._maps = [maps[i] for i in keep] if maps is not None else [None] * len(keep)
        self._starts = np.cumsum([0] + [len(a) for a in self._arrays])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``start .. start+length`` as a new int64 array (across shard boundaries).

        Raises:
            IndexError: the range leaves the stream.
        """
        if start < 0 or start + length > len(self):
            raise IndexError(f"tokens {start}..{start + length} outside a stream of {len(self)}")
        out = np.empty(length, dtype=np.int64)
        pos, k = 0, int(np.searchsorted(self._starts, start, side="right")) - 1
        while pos < length:
            a, lo = self._arrays[k], start + pos - int(self._starts[k])
            n = min(length - pos, len(a) - lo)
            out[pos:pos + n] = a[lo:lo + n]
            self._release(k, lo * a.itemsize, (lo + n) * a.itemsize)
            pos, k = pos + n, k + 1
        return out

    def _release(self, k: int, lo_byte: int, hi_byte: int) -> None:
        """Unmap the pages around bytes ``lo_byte .. hi_byte`` of shard ``k`` from this process."""
        mm = self._maps[k]
        if mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        lo = lo_byte // _RELEASE_BYTES * _RELEASE_BYTES
        hi = min(len(mm), -(-hi_byte // _RELEASE_BYTES) * _RELEASE_BYTES)
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def gather(self, offsets, length: int):
        """Windows of ``length`` tokens at each of ``offsets`` (``[n]``), as an int64 torch tensor ``[n, length]``."""
        import torch

        rows = [self.read(int(o), length) for o in offsets]
        return torch.from_numpy(np.stack(rows)) if rows else torch.empty((0, length), dtype=torch.int64)


def open_split(index: ShardIndex, split: str) -> TokenStream:
    """``split``'s shards of ``index`` memory-mapped read-only (``mmap`` viewed by ``numpy.frombuffer``,
    what ``numpy.memmap`` does) as one :class:`TokenStream`."""
    arrays, maps = [], []
    for s in index.shards(split):
        if not int(s["tokens"]):
            continue
        with open(index.root / s["file"], "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        arrays.append(np.frombuffer(mm, dtype=index.dtype, count=int(s["tokens"])))
        maps.append(mm)
    return TokenStream(arrays, maps)


def _cache_root() -> Path:
    return Path(os.environ.get("CRITBATCH_DATA_CACHE") or Path.home() / ".cache" / "critbatch" / "shards")


def local_shards(uri: str) -> Path:
    """A local copy of the prepared corpus at fsspec ``uri``, made once per node (per cache folder).

    The copy lives in ``$CRITBATCH_DATA_CACHE`` (default ``~/.cache/critbatch/shards``) under a hash
    of the URI and its index; a file lock makes the workers of one node fetch it once, and each shard
    is checked against its SHA-256 before the copy is marked complete.

    Raises:
        DataError: the URI cannot be read, holds no index, or a shard's checksum differs.
    """
    import fsspec
    from filelock import FileLock

    try:
        fs, base = fsspec.core.url_to_fs(uri)
        raw_index = fs.cat_file(f"{base.rstrip('/')}/{INDEX_FILE}")
    except Exception as exc:  # noqa: BLE001 - fsspec backends raise their own errors
        raise DataError(f"cannot read {INDEX_FILE} at {uri}: {exc}") from None
    key = hashlib.sha256(uri.encode() + b"\0" + raw_index).hexdigest()[:16]
    dest = _cache_root() / key
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock"):
        if (dest / ".complete").is_file():
            return dest
        dest.mkdir(exist_ok=True)
        index = json.loads(raw_index)
        for s in index.get("shards", []):
            local = dest / s["file"]
            fs.get_file(f"{base.rstrip('/')}/{s['file']}", str(local))
            if file_sha256(local) != s["sha256"]:
                raise DataError(f"shard {s['file']} fetched from {uri} does not match its sha256 in the index")
        (dest / INDEX_FILE).write_bytes(raw_index)
        (dest / ".complete").touch()
    return dest
