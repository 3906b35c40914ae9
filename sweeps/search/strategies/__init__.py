"""Search strategies (``search.strategy``) by name: the front door of :mod:`sweeps.search.strategies`.

Adding a strategy is one module (a :class:`SearchStrategy` subclass with its ``name``) and one registration line,
``STRATEGY_REGISTRY.register(name, "module.path:ClassName")`` (the product's own in :mod:`sweeps.spec.registry`).
:data:`STRATEGIES` is that registry: the spec validates ``search.strategy`` against its names without importing
the search, and the searcher imports a strategy's module when it is first asked for.
"""

from __future__ import annotations

from typing import cast

import optuna

from sweeps.search.strategies.base import INITIAL_POINT_ATTR, SearchStrategy
from sweeps.search.strategies.independent import INITIAL_POINTS_ENQUEUED_ATTR, IndependentStrategy
from sweeps.search.strategies.transfer import TRANSFER_POINT_ATTR, TransferStrategy
from sweeps.spec import STRATEGY_REGISTRY, Registry, SweepSpec

__all__ = [
    "INITIAL_POINTS_ENQUEUED_ATTR",
    "INITIAL_POINT_ATTR",
    "STRATEGIES",
    "TRANSFER_POINT_ATTR",
    "IndependentStrategy",
    "SearchStrategy",
    "TransferStrategy",
    "search_space",
    "strategy_for",
]

#: every search strategy, by its ``search.strategy`` name (:data:`sweeps.spec.registry.STRATEGY_REGISTRY`)
STRATEGIES = cast("Registry[type[SearchStrategy]]", STRATEGY_REGISTRY)


def strategy_for(spec: SweepSpec, name: str | None = None) -> SearchStrategy:
    """A new strategy for ``spec``: ``name``'s, or ``spec.search.strategy``'s.

    Raises:
        InvalidInput: the name is not one of :data:`STRATEGIES` (the message lists them).
    """
    return STRATEGIES.resolve(spec.search.strategy if name is None else name)(spec)


def search_space(spec: SweepSpec) -> dict[str, optuna.distributions.BaseDistribution]:
    """The Optuna distributions each batch size's study samples under ``spec``'s strategy
    (:meth:`SearchStrategy.search_space`).

    Raises:
        InvalidInput: ``spec.search.strategy`` is not one of :data:`STRATEGIES`.
    """
    return strategy_for(spec).search_space()
