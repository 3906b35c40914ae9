"""Writes of a sweep's records that a full disk or a kill cannot leave half done.

Every record the driver writes (``sweep.json``, ``trials.json``, ``cbs.json``, ``report.html``, the
searcher's and the scheduler's state, the best checkpoint, ...) goes through one of these:

- :func:`write_atomic` (and :func:`write_json`): the bytes go to a temporary file in the same folder,
  are flushed and fsynced, and replace the file with ``os.replace``; on any failure the temporary
  file is removed and the previous file is left as it was.
- :func:`append_line`: one JSON Lines row appended whole or not at all (a failed append is cut
  back off), after a newline if a crash left the file without one.
- :func:`replace_tree`: a folder copied beside its place, then swapped in.

A failed write raises :class:`~sweeps.errors.WriteFailed`, whose message names the path and the
cause ("no space left on device while writing OUT/trials.json"). Only the standard library is used,
so every layer of ``sweeps`` may import this module.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sweeps.errors import WriteFailed

__all__ = [
    "SpaceReserve",
    "append_line",
    "out_of_space_cause",
    "read_json_lines",
    "read_tail",
    "replace_tree",
    "write_atomic",
    "write_failed",
    "write_json",
]

#: errnos that mean the filesystem has no room (ENOSPC) or the user's quota is spent (EDQUOT)
OUT_OF_SPACE = (errno.ENOSPC, errno.EDQUOT)


def out_of_space_cause(exc: BaseException, folder: str | os.PathLike) -> str | None:
    """One line saying that ``exc`` came of a full disk, or None if it did not.

    A :class:`WriteFailed` says which write failed; an ``OSError`` with ``ENOSPC``/``EDQUOT`` in the chain
    names its file when it has one; an error whose text says "No space left on device" (Ray Tune wraps a
    callback's error in a ``TuneError`` that keeps only its text), or any error while ``folder``'s
    filesystem has less than 1 MiB free (Ray reading back a file it could not write), names ``folder``.
    """
    seen = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, WriteFailed):
            return str(e)
        if isinstance(e, OSError) and e.errno in OUT_OF_SPACE:
            return (
                f"no space left on device while writing {e.filename}"
                if e.filename
                else (f"no space left on device in {folder}")
            )
        e = e.__cause__ or e.__context__
    first = (str(exc).strip().splitlines() or [""])[-1][:300]
    if "No space left on device" in str(exc) or "Disk quota exceeded" in str(exc):
        return f"no space left on device in {folder} ({first})"
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free < 2**20:
        return f"no space left on device in {folder} ({free} bytes free; {type(exc).__name__}: {first})"
    return None


def write_failed(path: str | os.PathLike, exc: OSError) -> WriteFailed:
    """The :class:`WriteFailed` for ``exc`` raised while writing ``path``: "<cause> while writing <path>",
    the cause in lower case ("no space left on device")."""
    out_of_space = exc.errno in OUT_OF_SPACE
    cause = exc.strerror or str(exc) or type(exc).__name__
    if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) and exc.args[0]:
        cause = str(exc.args[0][0][-1])  # copytree gathers (src, dst, why) per file: the first why
        out_of_space = "No space left on device" in cause or "Disk quota exceeded" in cause
        cause = re.sub(r"^\[Errno \d+\] ([^:]+).*$", r"\1", cause)
    cause = cause[:1].lower() + cause[1:]
    return WriteFailed(f"{cause} while writing {path}", path=str(path), out_of_space=out_of_space)


def write_atomic(
    path: str | os.PathLike, data: bytes | str | Callable[[Any], None], *, encoding: str = "utf-8"
) -> Path:
    """Write ``path`` whole or not at all.

    Args:
        path: the file; its folder must exist.
        data: the content (``str`` is encoded with ``encoding``), or a function that writes it to the
            open binary file it is given (e.g. ``lambda f: pickle.dump(obj, f)``).

    Returns:
        ``path`` as a :class:`Path`.

    Raises:
        WriteFailed: the write, the fsync or the replace failed (the previous file, if any, is unchanged
            and no temporary file is left).
    """
    path = Path(path)
    fd, tmp = None, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            fd = None  # the file object owns it now
            if callable(data):
                data(f)
            else:
                f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600; a record is as readable as any other file
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise write_failed(path, exc) from exc
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return path


def write_json(path: str | os.PathLike, data: Any, *, indent: int | None = 2, default: Callable | None = None) -> Path:
    """:func:`write_atomic` of ``json.dumps(data, indent=indent, default=default)``.

    Raises:
        WriteFailed: see :func:`write_atomic`.
    """
    return write_atomic(path, json.dumps(data, indent=indent, default=default))


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` (one JSON Lines row, without its newline) to ``path``, whole or not at all.

    A file that does not end with a newline (an append cut by a crash) gets one first, so the new row
    never runs into a torn one. A failed append is cut back off (``ftruncate`` to the old size).

    Raises:
        WriteFailed: the append failed (the file holds the rows it held before, and perhaps the newline).
    """
    path = Path(path)
    blob = (line.rstrip("\n") + "\n").encode("utf-8")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        raise write_failed(path, exc) from exc
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            try:
                os.write(fd, b"\n")
                size += 1
            except OSError as exc:
                raise write_failed(path, exc) from exc
        try:
            written = 0
            while written < len(blob):
                written += os.write(fd, blob[written:])
            os.fsync(fd)
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
            except OSError:
                pass
            raise write_failed(path, exc) from exc
    finally:
        os.close(fd)


def read_json_lines(path: str | os.PathLike) -> list[dict]:
    """The JSON objects of a JSON Lines file written by :func:`append_line`, skipping a line torn by a
    crash mid-append; [] if the file does not exist."""
    rows = []
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def read_tail(path: str | os.PathLike | None, chars: int) -> str | None:
    """The last ``chars`` characters of the text file ``path`` (undecodable bytes replaced), or None if
    there is no path or the file cannot be read."""
    if not path:
        return None
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError:
        return None


def replace_tree(
    src: str | os.PathLike, dst: str | os.PathLike, *, extra: dict[str, bytes | str] | None = None
) -> Path:
    """Copy the folder ``src`` to ``dst`` whole or not at all: into a temporary sibling of ``dst``, then
    swapped in (an old ``dst`` is removed only once the copy is complete).

    Args:
        extra: more files to write into the copy, ``{relative name: content}``.

    Raises:
        WriteFailed: the copy failed (``dst`` as it was, no temporary folder left).
    """
    dst = Path(dst)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent))
    old = dst.with_name(f".{dst.name}.old")
    try:
        shutil.copytree(src, tmp, dirs_exist_ok=True)
        for name, content in (extra or {}).items():
            (tmp / name).write_bytes(content.encode() if isinstance(content, str) else content)
        if dst.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dst, old)
        os.replace(tmp, dst)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not dst.exists():
            os.replace(old, dst)
        raise write_failed(dst, exc) from exc
    shutil.rmtree(old, ignore_errors=True)
    return dst


class SpaceReserve:
    """A file of ``size_bytes`` kept in a sweep's output folder so that, once its disk is full, the
    driver can still record how the sweep ended: :meth:`release` deletes it, freeing room for
    ``sweep.json``.

    Args:
        folder: the output folder.
        size_bytes: the room kept (default 256 KiB: ``sweep.json`` and the last records).
    """

    NAME = ".critbatch.reserve"

    def __init__(self, folder: str | os.PathLike, size_bytes: int = 256 * 1024):
        self.path = Path(folder) / self.NAME
        self.size_bytes = size_bytes

    def keep(self) -> None:
        """Create the reserve if it is missing (or short).

        Raises:
            WriteFailed: there is not even that much room (nothing is left behind).
        """
        if self.path.is_file() and self.path.stat().st_size >= self.size_bytes:
            return
        write_atomic(self.path, b"\0" * self.size_bytes)

    def release(self) -> bool:
        """Delete the reserve; True if it was there."""
        try:
            self.path.unlink()
            return True
        except FileNotFoundError:
            return False
