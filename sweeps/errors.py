"""The sweeps package's exceptions: one base, and one for invalid input (exit code 2)."""

from __future__ import annotations

__all__ = ["CritbatchError", "InvalidInput", "SweepFailed"]


class CritbatchError(Exception):
    """Base class of every error the sweep engine raises on purpose."""


class InvalidInput(CritbatchError, ValueError):
    """The user's input is wrong (a file, a folder, a flag): nothing was started."""


class SweepFailed(CritbatchError):
    """The sweep ran but produced no usable result (every trial failed, or the analysis could not run)."""
