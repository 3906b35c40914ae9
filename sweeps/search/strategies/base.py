"""What a search strategy decides, and nothing else: which batch size is handed a trial next, where each group
(one configuration at one batch size, run once per seed) is placed in its batch size's Optuna study, how its
sampled values become the trial's hyperparameters, and what the strategy keeps as a group ends.

:class:`SearchStrategy` is the base (as optuna's ``BaseSampler`` is a sampler's); the searcher
(:class:`sweeps.search.searcher.BatchSizeSearcher`) holds one and keeps the bookkeeping every strategy shares
(trials handed out, groups, Optuna studies). A strategy's state is its instance's attributes: it is pickled with
the searcher (``save`` / ``restore`` and Tune's experiment state). The names live in
:data:`sweeps.search.strategies.STRATEGIES`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

import optuna

from sweeps.search.space import beta2_space, lr_rule_space
from sweeps.spec import SweepSpec

__all__ = ["INITIAL_POINT_ATTR", "Group", "SearchStrategy"]

#: Optuna user attribute of an enqueued ``search.initial_points`` trial: the point's index
INITIAL_POINT_ATTR = "critbatch.initial_point"


class Group(Protocol):
    """What a strategy reads of a group (:class:`sweeps.search.searcher._Group`)."""

    batch: int
    params: dict[str, Any]

    def finished(self) -> bool: ...


class SearchStrategy:
    """Where a sweep's trials go: the base of ``search.strategy``'s choices.

    Args:
        spec: the sweep (``spec.search`` says what is searched).

    A subclass sets :attr:`name` (its ``search.strategy`` value) and overrides :meth:`next_batch_size` and
    :meth:`hyperparameters`; :meth:`search_space` defaults to the spec's searched dimensions, the other methods to
    "nothing to do".
    """

    #: the ``search.strategy`` value that selects it
    name: ClassVar[str]
    #: whether ``search.precision`` may add LR probes (trials at a chosen LR): only where the strategy places LRs
    places_lr_probes: ClassVar[bool] = False

    def __init__(self, spec: SweepSpec) -> None:
        self.spec = spec

    def search_space(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """The Optuna distributions each batch size's study samples (the dimensions that vary; fixed ones are
        left out). By default the LR rule, the LR multiplier and beta2 or its half-life
        (:func:`~sweeps.search.space.lr_rule_space`, :func:`~sweeps.search.space.beta2_space`)."""
        return {**lr_rule_space(self.spec), **beta2_space(self.spec)}

    def order(self, batch_sizes: Sequence[int]) -> list[int]:
        """The batch sizes (sequences) in the order the searcher keeps them; by default as given."""
        return list(batch_sizes)

    def next_batch_size(self, batch_sizes: Sequence[int], has_trials_left: Callable[[int], bool]) -> int | None:
        """The batch size (sequences) that is handed the next trial, among ``batch_sizes`` (the searcher's order)
        with ``has_trials_left``; None when none may start now."""
        raise NotImplementedError

    def start(self, batch_size: int, batch_sizes: Sequence[int]) -> None:
        """Called before each trial of ``batch_size`` is handed out (what a strategy fixes when a batch size starts,
        it fixes on the first call); ``batch_sizes``: the searcher's order."""

    def prepare_study(self, study: optuna.Study, space: dict[str, Any]) -> None:
        """Called once per opened study (new or restored), after the searcher recorded its fingerprint."""

    def point(
        self, batch_size: int, index: int, probe_lrs: Sequence[float]
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The values to enqueue in ``batch_size``'s study for its group number ``index`` (0-based) and their Optuna
        user attributes, or None to let the sampler choose. ``probe_lrs``: the LRs of the groups
        ``search.precision`` added at this batch size, in order, after the ``trials_per_batch_size`` planned ones."""
        return None

    def hyperparameters(self, batch_size: int, params: dict[str, Any]) -> dict[str, Any]:
        """A group's trial hyperparameters (``lr``, ``lr_rule``, ``lr_multiplier``, ``beta2``,
        ``beta2_half_life_tokens``) from its study's sampled ``params``."""
        raise NotImplementedError

    def group_ended(
        self, group: Group, objective: float | None, batch_groups: list[Any] | None, fastest: Callable[[list[Any]], Any]
    ) -> None:
        """A group ended (every seed). ``objective``: the mean of its seeds' objectives, None if one was pruned or
        none completed; ``batch_groups``: every group of its batch size once all its trials were handed out and
        ended, else None; ``fastest(groups)``: the group fastest at the fit's target losses, or None."""

    def places_probe(self, batch_size: int, lr: float) -> bool:
        """Whether a ``search.precision`` LR probe at ``lr`` runs at that LR at ``batch_size``."""
        return False
