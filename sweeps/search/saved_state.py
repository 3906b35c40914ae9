"""The searcher's saved state across layouts: a searcher saved (``save``, or pickled by Tune in its experiment
state) before the strategy and the wave policy were objects of their own kept them as its own attributes
(``transfer``, ``transfer_state``, ``_rr``; ``precision``, ``extra_groups``, ``waves``, ...). :func:`composed_state`
moves those into a :class:`~sweeps.search.strategies.SearchStrategy` and a
:class:`~sweeps.search.waves.PrecisionWaves`, so such a searcher goes on as the composed one.
"""

from __future__ import annotations

from typing import Any

from sweeps.search.strategies import strategy_for
from sweeps.search.waves import PrecisionWaves

__all__ = ["composed_state"]


def composed_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a searcher's ``__dict__``, saved by any revision) in the composed layout: ``strategy`` and
    ``wave_policy`` present, their attributes no longer at the top. A state already composed is returned as is.

    The strategy of an old state is ``transfer`` where its ``transfer`` flag was set, else ``independent`` (a
    state saved before ``search.strategy`` existed); a wave policy missing attributes gets their defaults
    (a state saved before ``search.precision``, or before one of its settings)."""
    out = dict(state)
    out.setdefault("objectives", {})  # saved before the tokens-to-target objective
    spec = out["spec"]
    if "strategy" not in out:
        strategy = strategy_for(spec, "transfer" if out.pop("transfer", False) else "independent")
        _move(out, strategy.__dict__)
        out["strategy"] = strategy
    if "wave_policy" not in out:
        policy = PrecisionWaves(spec, out.get("precision"))
        _move(out, policy.__dict__)
        out["wave_policy"] = policy
    for k in ("transfer", "transfer_state", "_rr"):  # the other strategy's, in an old state
        out.pop(k, None)
    return out


def _move(state: dict[str, Any], into: dict[str, Any]) -> None:
    """Move the entries of ``state`` named like ``into``'s (its defaults), the spec aside, into ``into``."""
    for k in list(into):
        if k != "spec" and k in state:
            into[k] = state.pop(k)
