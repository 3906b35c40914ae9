"""Search strategies (``search.strategy``) by name: the front door of :mod:`sweeps.search.strategies`.

Adding a strategy is one module beside these (a :class:`SearchStrategy` subclass with its ``name``) and one line
in :data:`STRATEGIES`; ``sweeps.spec``'s ``SearchStrategyName`` lists the same names (plain data: the spec does
not import the search), and ``tests/sweeps/search/test_strategies.py`` ties the two.
"""

from __future__ import annotations

from sweeps.errors import InvalidInput
from sweeps.search.strategies.base import INITIAL_POINT_ATTR, SearchStrategy
from sweeps.search.strategies.independent import INITIAL_POINTS_ENQUEUED_ATTR, IndependentStrategy
from sweeps.search.strategies.transfer import TRANSFER_POINT_ATTR, TransferStrategy
from sweeps.spec import SweepSpec

__all__ = [
    "INITIAL_POINTS_ENQUEUED_ATTR",
    "INITIAL_POINT_ATTR",
    "STRATEGIES",
    "TRANSFER_POINT_ATTR",
    "IndependentStrategy",
    "SearchStrategy",
    "TransferStrategy",
    "strategy_for",
]

#: every search strategy, by its ``search.strategy`` name
STRATEGIES: dict[str, type[SearchStrategy]] = {
    IndependentStrategy.name: IndependentStrategy,
    TransferStrategy.name: TransferStrategy,
}


def strategy_for(spec: SweepSpec, name: str | None = None) -> SearchStrategy:
    """A new strategy for ``spec``: ``name``'s, or ``spec.search.strategy``'s.

    Raises:
        InvalidInput: the name is not one of :data:`STRATEGIES` (the message lists them).
    """
    name = spec.search.strategy if name is None else name
    if name not in STRATEGIES:
        raise InvalidInput(f"search.strategy: {name!r} is not one of {sorted(STRATEGIES)}")
    return STRATEGIES[name](spec)
