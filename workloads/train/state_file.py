"""A trial's state written to a file (``torch.save``) so that a full disk says so, naming the file.

torch's zip writer reports a write into a full filesystem in its own words: ``RuntimeError: [enforce fail
at inline_container.cc:672] . unexpected pos 161472 vs 161360`` (or ``basic_ios::clear: iostream error``),
which names neither the cause nor the file; a sweep whose output disk had filled failed every trial so.
:func:`save_state` writes through a Python file, whose failed write leaves the ``OSError`` (``ENOSPC``)
in the chain of torch's error, and raises :class:`~workloads.errors.OutOfSpace` instead
(:func:`out_of_space_error` is the rule, also for a copy of the file to the trial's storage).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from typing import Any

import torch

from workloads.errors import OutOfSpace

__all__ = ["NEARLY_FULL_BYTES", "out_of_space_error", "save_state"]

#: the errnos of a full filesystem and of a spent quota, and how each reads
_CAUSES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded"}
#: a write error of torch's (no errno) is taken for a full disk when its folder has less room than this
NEARLY_FULL_BYTES = 2**20
#: what torch's zip writer says when a write of its fails (inline_container.cc; the stream's own error)
_TORCH_WRITE_FAILED = ("unexpected pos", "file write failed", "iostream error", "PytorchStreamWriter failed")


def save_state(state: dict[str, Any], path: str, *, shown_as: str | None = None) -> None:
    """``torch.save(state)`` to the file ``path``.

    Args:
        shown_as: the path an error names (default ``path``): where the file ends up when ``path`` is a
            temporary name for it.

    Raises:
        OutOfSpace: the filesystem of ``path`` is full (or the quota spent); a partial file may be left.
        OSError, RuntimeError: any other failure, as torch or the OS raised it.
    """
    try:
        with open(path, "wb") as f:
            torch.save(state, f)
    except (OSError, RuntimeError) as exc:
        error = out_of_space_error(
            exc, f"the checkpoint to {shown_as or path}", os.path.dirname(path) or ".", by="torch"
        )
        if error is None:
            raise
        raise error from exc


def out_of_space_error(
    exc: BaseException, what: str, folder: str | None, *, by: str | None = None
) -> OutOfSpace | None:
    """An :class:`OutOfSpace` saying "no space left on device while writing WHAT (BY: EXC'S WORDS)" if
    ``exc`` came of a full filesystem, else None. ``by``: who raised ``exc`` (default its type's name).

    It did if an ``OSError`` with ``ENOSPC`` or ``EDQUOT`` is in its chain (``__cause__``, ``__context__``),
    or its text says "No space left on device" (pyarrow's copy, Ray's upload), or it is torch's write error
    while ``folder`` (local, when given) has less than :data:`NEARLY_FULL_BYTES` free: ask before the
    partial file is deleted, which frees its room again.
    """
    if isinstance(exc, OutOfSpace):  # said already
        return exc
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _CAUSES:
            return _error(e.errno, what, exc, by, found=e)
        e = e.__cause__ or e.__context__
    text = str(exc)
    if "No space left on device" in text:
        return _error(errno.ENOSPC, what, exc, by)
    if "Disk quota exceeded" in text:
        return _error(errno.EDQUOT, what, exc, by)
    if folder is None or not any(m in text for m in _TORCH_WRITE_FAILED):
        return None
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return None
    if free >= NEARLY_FULL_BYTES:
        return None
    return _error(errno.ENOSPC, what, exc, by, note=f"{free} bytes free")


def _error(
    code: int, what: str, exc: BaseException, by: str | None, *, found: BaseException | None = None, note: str = ""
) -> OutOfSpace:
    """The :class:`OutOfSpace`, with the words of the error raised (unless it is the ``OSError`` itself)."""
    words = "" if found is exc else _words(exc, by)
    detail = "; ".join(x for x in (note, words) if x)
    return OutOfSpace(code, f"{_CAUSES[code]} while writing {what}" + (f" ({detail})" if detail else ""))


def _words(exc: BaseException, by: str | None) -> str:
    """``BY: exc's last line``, without torch's ``[enforce fail at FILE:LINE] . `` prefix ("torch: unexpected pos ...")."""
    line = (str(exc).strip().splitlines() or [""])[-1]
    line = re.sub(r"^\[enforce fail at [^\]]*\]\s*\.?\s*", "", line)[:300]
    return f"{by or type(exc).__name__}: {line}" if line else (by or type(exc).__name__)
