"""The one error base of the whole project, at its lowest layer: every error ``critbatch`` raises on
purpose, in every package, derives from :class:`CritbatchError` (``workloads`` here, ``sweeps`` through
``sweeps.errors``, the REST service through ``service.errors``).

:class:`InvalidInput` is the user's input being wrong: the command line exits 2 on it and the REST
service answers 422. It is also a ``ValueError``, so that callers that catch ``ValueError`` keep doing
so. ``workloads`` raises :class:`DataError`, one kind of invalid input.

A trial whose write finds its filesystem full raises :class:`OutOfSpace` (an ``OSError`` with ``ENOSPC``
or ``EDQUOT``) naming what it wrote and where, in place of the library's own words (torch's
"unexpected pos").

Imported by ``workloads.api`` (which ``sweeps`` and ``service`` read it through): plain Python, no torch.
"""

from __future__ import annotations

__all__ = ["CritbatchError", "DataError", "InvalidInput", "OutOfSpace"]


class CritbatchError(Exception):
    """Base class of every error critbatch raises on purpose, whatever the layer."""


class InvalidInput(CritbatchError, ValueError):
    """The user's input is wrong (a spec, a file, a folder, a flag): nothing was started. The command
    line prints ``error: <message>`` and exits 2; the REST service answers 422."""


class DataError(InvalidInput):
    """The inputs cannot be used: a missing, empty or too short corpus, malformed fine-tuning data
    (line and field named), a missing checkpoint, the finetune workload without its ``finetune`` section
    (a section's own bounds and checks raise ``pydantic.ValidationError``, also a ``ValueError``)."""


class OutOfSpace(CritbatchError, OSError):
    """A write found its filesystem full (``errno`` ``ENOSPC``) or its quota spent (``EDQUOT``). Built as
    ``OutOfSpace(errno, message)``; the message, its whole text, names what was written and where ("no
    space left on device while writing the checkpoint to PATH (torch: unexpected pos ...)")."""

    def __str__(self) -> str:
        return str(self.strerror)
