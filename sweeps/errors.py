"""The sweeps package's exceptions: one base, and one for invalid input (exit code 2)."""

from __future__ import annotations

__all__ = ["CritbatchError", "InvalidInput", "SweepFailed", "WriteFailed"]


class CritbatchError(Exception):
    """Base class of every error the sweep engine raises on purpose."""


class InvalidInput(CritbatchError, ValueError):
    """The user's input is wrong (a file, a folder, a flag): nothing was started."""


class SweepFailed(CritbatchError):
    """The sweep ran but produced no usable result (every trial failed, or the analysis could not run)."""


class WriteFailed(CritbatchError):
    """A record could not be written (a full disk, a missing permission): the previous file is unchanged
    (:mod:`sweeps.files`). The message reads "<cause> while writing <path>".

    Attributes:
        path: the file that was being written.
        out_of_space: the cause was ``ENOSPC`` or ``EDQUOT``.
    """

    def __init__(self, message: str, *, path: str = "", out_of_space: bool = False):
        super().__init__(message)
        self.path = path
        self.out_of_space = out_of_space

    def __reduce__(self):
        return _write_failed, (self.args[0], self.path, self.out_of_space)

    def __str__(self) -> str:
        return self.args[0]


def _write_failed(message: str, path: str, out_of_space: bool) -> WriteFailed:
    return WriteFailed(message, path=path, out_of_space=out_of_space)
