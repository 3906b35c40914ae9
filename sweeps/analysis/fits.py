"""The fits of steps to a target against batch size, by name: the registry the analysis calls a fit through.

A fit is a :class:`~sweeps.analysis.fit_base.Fit` registered here once, under its ``name``, by the line
``register_fit(...)`` below; :func:`get_fit` returns it and :func:`fit_names` lists the names (what a spec or a
CLI option choosing a fit may say). ``hyperbola`` (:class:`~sweeps.analysis.hyperbola.Hyperbola`) is the
default.
"""

from __future__ import annotations

from sweeps.analysis.fit_base import Fit
from sweeps.analysis.hyperbola import Hyperbola

__all__ = ["DEFAULT_FIT", "Fit", "fit_names", "get_fit", "register_fit"]

_FITS: dict[str, Fit] = {}

#: the fit the analysis uses unless told otherwise
DEFAULT_FIT = "hyperbola"


def register_fit(fit: Fit) -> Fit:
    """Register ``fit`` under ``fit.name``; returns it.

    Raises:
        ValueError: a fit of that name is registered already.
    """
    if fit.name in _FITS:
        raise ValueError(f"a fit named {fit.name!r} is registered already")
    _FITS[fit.name] = fit
    return fit


def get_fit(name: str) -> Fit:
    """The fit registered as ``name``.

    Raises:
        KeyError: no fit has that name (the message lists the names there are).
    """
    try:
        return _FITS[name]
    except KeyError:
        raise KeyError(f"unknown fit {name!r}: one of {', '.join(fit_names())}") from None


def fit_names() -> tuple[str, ...]:
    """The registered fits' names, in the order they were registered."""
    return tuple(_FITS)


register_fit(Hyperbola())
