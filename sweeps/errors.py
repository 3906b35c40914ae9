"""The sweeps package's exceptions. The base, :class:`CritbatchError`, and :class:`InvalidInput` (exit
code 2) are the project's one error base, defined at its lowest layer (``workloads.errors``) and
re-exported here, so that ``from sweeps.errors import CritbatchError`` names the same class everywhere.
"""

from __future__ import annotations

from workloads.api import CritbatchError, InvalidInput

__all__ = ["CritbatchError", "InvalidInput", "SweepFailed", "WriteFailed"]


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
